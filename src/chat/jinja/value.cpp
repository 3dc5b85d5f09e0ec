#include "chat/jinja/value.h"

#include <algorithm>

#include "chat/jinja/loop_state.h"

namespace se::jinja {

struct Value::RangeData {
  std::vector<Value> items;
  std::array<int64_t, 3> bounds;
};

struct Value::ViewData {
  std::vector<Value> items;  // keys, values or (key, value) tuples
  View view;
};

namespace {

int max_depth(const std::vector<Value>& items) {
  int d = 0;
  for (const Value& v : items) d = std::max(d, v.depth());
  return d;
}

}  // namespace

Value Value::undefined(std::string hint) {
  Value v;
  v.payload_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = ValueKind::kNone;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = ValueKind::kBool;
  v.payload_ = static_cast<int64_t>(b ? 1 : 0);
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = ValueKind::kInt;
  v.payload_ = i;
  return v;
}

Value Value::floating(double f) {
  Value v;
  v.kind_ = ValueKind::kFloat;
  v.payload_ = f;
  return v;
}

Value Value::string(std::string s, bool markup) {
  Value v;
  v.kind_ = ValueKind::kString;
  v.markup_ = markup;
  v.payload_ = std::make_shared<const std::string>(std::move(s));
  return v;
}

Value Value::list(std::vector<Value> items) {
  Value v;
  v.kind_ = ValueKind::kList;
  v.depth_ = 1 + max_depth(items);
  v.payload_ = std::make_shared<const std::vector<Value>>(std::move(items));
  return v;
}

Value Value::tuple(std::vector<Value> items) {
  Value v = list(std::move(items));
  v.kind_ = ValueKind::kTuple;
  return v;
}

Value Value::range(int64_t start, int64_t stop, int64_t step) {
  auto data = std::make_shared<RangeData>();
  data->bounds = {start, stop, step};
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    data->items.push_back(Value::integer(i));
  }
  Value v;
  v.kind_ = ValueKind::kRange;
  v.depth_ = 1;
  v.payload_ = std::shared_ptr<const RangeData>(std::move(data));
  return v;
}

Value Value::dict_view(const Dict& dict, View view) {
  auto data = std::make_shared<ViewData>();
  data->view = view;
  for (const auto& [key, value] : dict.items()) {
    data->items.push_back(view == View::kKeys     ? key
                          : view == View::kValues ? value
                                                  : Value::tuple({key, value}));
  }
  Value v;
  v.kind_ = ValueKind::kDictView;
  v.depth_ = 1 + max_depth(data->items);
  v.payload_ = std::shared_ptr<const ViewData>(std::move(data));
  return v;
}

Value Value::dict(Dict d) {
  Value v;
  v.kind_ = ValueKind::kDict;
  v.depth_ = 1 + d.depth();
  v.payload_ = std::make_shared<const Dict>(std::move(d));
  return v;
}

Value Value::iterator(std::vector<Value> items, std::string type_name) {
  Value v;
  v.kind_ = ValueKind::kIterator;
  v.depth_ = 1 + max_depth(items);
  auto state = std::make_shared<IteratorState>();
  state->buffered = std::move(items);
  state->type_name = std::move(type_name);
  v.payload_ = std::move(state);
  return v;
}

Value Value::generator(std::function<Result<std::optional<Value>>(Interpreter&)> produce,
                       std::string origin) {
  Value v;
  v.kind_ = ValueKind::kIterator;
  auto state = std::make_shared<IteratorState>();
  state->produce = std::move(produce);
  state->origin = std::move(origin);
  v.payload_ = std::move(state);
  return v;
}

Value Value::callable(std::shared_ptr<Callable> c) {
  Value v;
  v.kind_ = ValueKind::kCallable;
  v.payload_ = std::move(c);
  return v;
}

Value Value::namespace_object(std::shared_ptr<Namespace> ns) {
  Value v;
  v.kind_ = ValueKind::kNamespace;
  v.depth_ = 1 + ns->attrs.depth();
  v.payload_ = std::move(ns);
  return v;
}

Value Value::loop(std::shared_ptr<LoopState> state) {
  Value v;
  v.kind_ = ValueKind::kLoop;
  v.payload_ = std::move(state);
  return v;
}

double Value::as_float() const {
  if (kind_ == ValueKind::kFloat) return std::get<double>(payload_);
  return static_cast<double>(std::get<int64_t>(payload_));
}

const std::string& Value::as_string() const {
  return *std::get<std::shared_ptr<const std::string>>(payload_);
}

const std::vector<Value>& Value::items() const {
  if (kind_ == ValueKind::kRange)
    return std::get<std::shared_ptr<const RangeData>>(payload_)->items;
  if (kind_ == ValueKind::kDictView) {
    return std::get<std::shared_ptr<const ViewData>>(payload_)->items;
  }
  return *std::get<std::shared_ptr<const std::vector<Value>>>(payload_);
}

Value::View Value::dict_view_kind() const {
  return std::get<std::shared_ptr<const ViewData>>(payload_)->view;
}

std::array<int64_t, 3> Value::range_bounds() const {
  return std::get<std::shared_ptr<const RangeData>>(payload_)->bounds;
}

const Dict& Value::as_dict() const { return *std::get<std::shared_ptr<const Dict>>(payload_); }

Namespace& Value::as_namespace() const { return *std::get<std::shared_ptr<Namespace>>(payload_); }

IteratorState& Value::as_iterator() const {
  return *std::get<std::shared_ptr<IteratorState>>(payload_);
}

const std::shared_ptr<Callable>& Value::as_callable() const {
  return std::get<std::shared_ptr<Callable>>(payload_);
}

LoopState& Value::as_loop() const { return *std::get<std::shared_ptr<LoopState>>(payload_); }

const std::string& Value::undefined_hint() const {
  static const std::string kEmpty;
  const auto* hint = std::get_if<std::shared_ptr<const std::string>>(&payload_);
  return hint != nullptr ? **hint : kEmpty;
}

bool Value::truthy() const {
  switch (kind_) {
    case ValueKind::kUndefined:
    case ValueKind::kNone:
      return false;
    case ValueKind::kBool:
    case ValueKind::kInt:
      return as_int() != 0;
    case ValueKind::kFloat:
      return as_float() != 0.0;
    case ValueKind::kString:
      return !as_string().empty();
    case ValueKind::kList:
    case ValueKind::kTuple:
    case ValueKind::kRange:
    case ValueKind::kDictView:
      return !items().empty();
    case ValueKind::kDict:
      return !as_dict().empty();
    case ValueKind::kNamespace:
    case ValueKind::kIterator:
    case ValueKind::kCallable:
    case ValueKind::kLoop:
      return true;
  }
  return false;
}

const void* Value::identity() const {
  return std::visit(
      [](const auto& p) -> const void* {
        using P = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<P, std::monostate> || std::is_same_v<P, int64_t> ||
                      std::is_same_v<P, double>) {
          return nullptr;
        } else {
          return p.get();
        }
      },
      payload_);
}

bool py_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return a.as_float() == b.as_float();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case ValueKind::kUndefined:
    case ValueKind::kNone:
      return true;
    case ValueKind::kString:
      return a.as_string() == b.as_string();
    case ValueKind::kList:
    case ValueKind::kTuple:
    case ValueKind::kRange: {
      const auto& x = a.items();
      const auto& y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!py_equal(x[i], y[i])) return false;
      }
      return true;
    }
    case ValueKind::kDictView: {
      // Key and item views compare as sets; value views only by identity.
      if (a.dict_view_kind() != b.dict_view_kind() || a.dict_view_kind() == Value::View::kValues) {
        return a.identity() == b.identity();
      }
      const auto& x = a.items();
      const auto& y = b.items();
      if (x.size() != y.size()) return false;
      for (const Value& v : x) {
        if (std::none_of(y.begin(), y.end(), [&](const Value& w) { return py_equal(v, w); })) {
          return false;
        }
      }
      return true;
    }
    case ValueKind::kDict: {
      const Dict& x = a.as_dict();
      const Dict& y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const auto& [key, value] : x.items()) {
        const Value* other = y.find(key);
        if (other == nullptr || !py_equal(value, *other)) return false;
      }
      return true;
    }
    default:
      return a.identity() == b.identity();
  }
}

const Value* Dict::find(std::string_view key) const {
  auto it = string_index_.find(key);
  return it == string_index_.end() ? nullptr : &items_[it->second].second;
}

const Value* Dict::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.as_string()));
  for (const auto& [k, v] : items_) {
    if (!k.is_string() && py_equal(k, key)) return &v;
  }
  return nullptr;
}

void Dict::set(Value key, Value value) {
  depth_ = std::max(depth_, std::max(key.depth(), value.depth()));
  if (key.is_string()) {
    auto it = string_index_.find(std::string_view(key.as_string()));
    if (it != string_index_.end()) {
      items_[it->second].second = std::move(value);
      return;
    }
    string_index_.emplace(key.as_string(), items_.size());
    items_.emplace_back(std::move(key), std::move(value));
    return;
  }
  for (auto& [k, v] : items_) {
    if (!k.is_string() && py_equal(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items_.emplace_back(std::move(key), std::move(value));
}

}  // namespace se::jinja
