#include "chat/jinja/generators.h"

#include "chat/jinja/interpreter.h"
#include "chat/jinja/loop_state.h"
#include "chat/jinja/operators.h"
#include "chat/jinja/py_format.h"
#include "chat/jinja/unicode.h"

namespace se::jinja {

Result<std::optional<Value>> generator_next(Interpreter& interp, IteratorState& it) {
  if (it.pos < it.buffered.size()) return std::optional<Value>(it.buffered[it.pos++]);
  if (!it.produce) return std::optional<Value>();
  SE_RETURN_IF_ERROR(interp.count_step());
  Result<std::optional<Value>> next = it.produce(interp);
  if (!next.is_ok() || !next->has_value()) it.produce = nullptr;  // finished: drop its captures
  return next;
}

Result<PyIterator> PyIterator::over(const Value& v) {
  PyIterator it;
  switch (v.kind()) {
    case ValueKind::kUndefined:
      return it;
    case ValueKind::kList:
    case ValueKind::kTuple:
    case ValueKind::kRange:
    case ValueKind::kDictView:
      it.items_ = v.items();
      return it;
    case ValueKind::kDict:
      for (const auto& [key, value] : v.as_dict().items()) it.items_.push_back(key);
      return it;
    case ValueKind::kString:
      for (char32_t cp : utf8_decode(v.as_string())) {
        std::string c;
        append_utf8(c, cp);
        it.items_.push_back(Value::string(std::move(c), v.is_markup()));
      }
      return it;
    case ValueKind::kIterator:
      it.generator_ = v;
      return it;
    case ValueKind::kLoop:
      it.items_ = v.as_loop().take_rest(v);
      return it;
    default:
      return type_error(fmt::format("'{}' object is not iterable", py_type_name(v)));
  }
}

Result<std::optional<Value>> PyIterator::next(Interpreter& interp) {
  if (generator_.kind() == ValueKind::kIterator) {
    return generator_next(interp, generator_.as_iterator());
  }
  if (pos_ < items_.size()) return std::optional<Value>(items_[pos_++]);
  return std::optional<Value>();
}

}  // namespace se::jinja
