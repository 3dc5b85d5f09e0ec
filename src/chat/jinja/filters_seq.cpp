// Sequence filters: length, first/last, join, list, sorting, reverse, min/max/sum. The generator
// filters (items, unique, batch, map, select, ...) are in filters_lazy.cpp.
#include <algorithm>

#include "chat/jinja/builtin_args.h"
#include "chat/jinja/builtins_internal.h"
#include "chat/jinja/generators.h"
#include "chat/jinja/interpreter.h"
#include "chat/jinja/loop_state.h"
#include "chat/jinja/operators.h"
#include "chat/jinja/py_format.h"
#include "chat/jinja/unicode.h"

namespace se::jinja {
namespace {

Result<Value> f_length(Interpreter&, const Value& in, CallArgs& args) {
  SE_RETURN_IF_ERROR(bind_args("length", args, {}).status());
  switch (in.kind()) {
    case ValueKind::kUndefined:
      return Value::integer(0);
    case ValueKind::kString:
      return Value::integer(static_cast<int64_t>(utf8_length(in.as_string())));
    case ValueKind::kList:
    case ValueKind::kTuple:
    case ValueKind::kRange:
    case ValueKind::kDictView:
      return Value::integer(static_cast<int64_t>(in.items().size()));
    case ValueKind::kDict:
      return Value::integer(static_cast<int64_t>(in.as_dict().size()));
    case ValueKind::kNamespace:
      break;
    case ValueKind::kLoop:
      return Value::integer(static_cast<int64_t>(in.as_loop().items.size()));
    default:
      break;
  }
  return type_error(fmt::format("object of type '{}' has no len()", py_type_name(in)));
}

Result<Value> f_first(Interpreter& interp, const Value& in, CallArgs& args) {
  SE_RETURN_IF_ERROR(bind_args("first", args, {}).status());
  if (in.kind() == ValueKind::kIterator) {
    SE_ASSIGN_OR_RETURN(std::optional<Value> item, generator_next(interp, in.as_iterator()));
    if (item) return *item;
  } else {
    SE_ASSIGN_OR_RETURN(std::vector<Value> items, interp.iterate(in));
    if (!items.empty()) return items.front();
  }
  return Value::undefined("No first item, sequence was empty.");
}

Result<Value> f_last(Interpreter& interp, const Value& in, CallArgs& args) {
  SE_RETURN_IF_ERROR(bind_args("last", args, {}).status());
  switch (in.kind()) {
    case ValueKind::kUndefined:
    case ValueKind::kString:
    case ValueKind::kList:
    case ValueKind::kTuple:
    case ValueKind::kRange:
    case ValueKind::kDictView:
    case ValueKind::kDict: {
      SE_ASSIGN_OR_RETURN(std::vector<Value> items, interp.iterate(in));
      if (!items.empty()) return items.back();
      return Value::undefined("No last item, sequence was empty.");
    }
    default:
      return type_error(fmt::format("'{}' object is not reversible", py_type_name(in)));
  }
}

Result<std::vector<Value>> attribute_values(Interpreter& interp, std::vector<Value> items,
                                            const Value& attribute) {
  if (attribute.is_none()) return items;
  for (Value& item : items) {
    SE_ASSIGN_OR_RETURN(item, get_attribute_path(interp, item, attribute, std::nullopt));
  }
  return items;
}

Result<Value> f_join(Interpreter& interp, const Value& in, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(
      auto a, bind_args("join", args, {{"d", Value::string("")}, {"attribute", Value::none()}}));
  SE_ASSIGN_OR_RETURN(std::vector<Value> items, interp.iterate(in));
  SE_ASSIGN_OR_RETURN(items, attribute_values(interp, std::move(items), a[1]));
  std::string sep = py_str(a[0]);
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += sep;
    out += py_str(items[i]);
    SE_RETURN_IF_ERROR(interp.check_string_size(out.size()));
  }
  return Value::string(std::move(out));
}

Result<Value> f_list(Interpreter& interp, const Value& in, CallArgs& args) {
  SE_RETURN_IF_ERROR(bind_args("list", args, {}).status());
  SE_ASSIGN_OR_RETURN(std::vector<Value> items, interp.iterate(in));
  return Value::list(std::move(items));
}

Result<Value> f_dictsort(Interpreter&, const Value& in, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("dictsort", args,
                                        {{"case_sensitive", Value::boolean(false)},
                                         {"by", Value::string("key")},
                                         {"reverse", Value::boolean(false)}}));
  size_t pos;
  if (a[1].is_string() && a[1].as_string() == "key") {
    pos = 0;
  } else if (a[1].is_string() && a[1].as_string() == "value") {
    pos = 1;
  } else {
    return invalid_argument(
        "FilterArgumentError: You can only sort by either \"key\" or \"value\"");
  }
  if (in.is_undefined()) return undefined_error(in);
  if (in.kind() != ValueKind::kDict) {
    return invalid_argument("AttributeError: '{}' object has no attribute 'items'",
                            py_type_name(in));
  }
  std::vector<Value> pairs, keys;
  for (const auto& [k, v] : in.as_dict().items()) {
    pairs.push_back(Value::tuple({k, v}));
    const Value& key = pos == 0 ? k : v;
    keys.push_back(a[0].truthy() ? key : ignore_case(key));
  }
  SE_ASSIGN_OR_RETURN(pairs, sorted_by_keys(std::move(pairs), std::move(keys), a[2].truthy()));
  return Value::list(std::move(pairs));
}

// The key of jinja2's make_multi_attrgetter: a list with one entry per comma-separated path.
Result<Value> multi_attribute_key(Interpreter& interp, const Value& item, const Value& attribute,
                                  bool case_sensitive) {
  std::vector<Value> paths;
  if (attribute.is_string()) {
    const std::string& spec = attribute.as_string();
    size_t start = 0;
    while (true) {
      size_t comma = spec.find(',', start);
      paths.push_back(Value::string(spec.substr(start, comma - start)));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  } else {
    paths.push_back(attribute);
  }
  std::vector<Value> key;
  for (const Value& path : paths) {
    SE_ASSIGN_OR_RETURN(Value v, get_attribute_path(interp, item, path, std::nullopt));
    key.push_back(case_sensitive ? v : ignore_case(v));
  }
  return Value::list(std::move(key));
}

Result<Value> f_sort(Interpreter& interp, const Value& in, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("sort", args,
                                        {{"reverse", Value::boolean(false)},
                                         {"case_sensitive", Value::boolean(false)},
                                         {"attribute", Value::none()}}));
  SE_ASSIGN_OR_RETURN(std::vector<Value> items, interp.iterate(in));
  std::vector<Value> keys;
  for (const Value& item : items) {
    SE_ASSIGN_OR_RETURN(Value key, multi_attribute_key(interp, item, a[2], a[1].truthy()));
    keys.push_back(std::move(key));
  }
  SE_ASSIGN_OR_RETURN(items, sorted_by_keys(std::move(items), std::move(keys), a[0].truthy()));
  return Value::list(std::move(items));
}

// The type of Python's reversed(value).
std::string reverse_iterator_type(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kList:
      return "list_reverseiterator";
    case ValueKind::kRange:
      return "range_iterator";
    case ValueKind::kDict:
      return "dict_reversekeyiterator";
    case ValueKind::kDictView:
      return v.dict_view_kind() == Value::View::kKeys     ? "dict_reversekeyiterator"
             : v.dict_view_kind() == Value::View::kValues ? "dict_reversevalueiterator"
                                                          : "dict_reverseitemiterator";
    default:
      return "reversed";
  }
}

Result<Value> f_reverse(Interpreter& interp, const Value& in, CallArgs& args) {
  SE_RETURN_IF_ERROR(bind_args("reverse", args, {}).status());
  switch (in.kind()) {
    case ValueKind::kString: {
      std::u32string cps = utf8_decode(in.as_string());
      std::reverse(cps.begin(), cps.end());
      return Value::string(utf8_encode(cps), in.is_markup());
    }
    case ValueKind::kUndefined:
    case ValueKind::kList:
    case ValueKind::kTuple:
    case ValueKind::kRange:
    case ValueKind::kDictView:
    case ValueKind::kDict: {
      SE_ASSIGN_OR_RETURN(std::vector<Value> items, interp.iterate(in));
      std::reverse(items.begin(), items.end());
      return Value::iterator(std::move(items), reverse_iterator_type(in));
    }
    case ValueKind::kIterator: {
      SE_ASSIGN_OR_RETURN(std::vector<Value> items, interp.iterate(in));
      std::reverse(items.begin(), items.end());
      return Value::list(std::move(items));
    }
    default:
      return invalid_argument("FilterArgumentError: argument must be iterable");
  }
}

Result<Value> min_or_max(Interpreter& interp, const Value& in, CallArgs& args, bool want_max) {
  SE_ASSIGN_OR_RETURN(
      auto a, bind_args(want_max ? "max" : "min", args,
                        {{"case_sensitive", Value::boolean(false)}, {"attribute", Value::none()}}));
  SE_ASSIGN_OR_RETURN(std::vector<Value> items, interp.iterate(in));
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key;
  for (size_t i = 0; i < items.size(); ++i) {
    SE_ASSIGN_OR_RETURN(Value key, get_attribute_path(interp, items[i], a[1], std::nullopt));
    if (!a[0].truthy()) key = ignore_case(key);
    if (i == 0) {
      best_key = std::move(key);
      continue;
    }
    SE_ASSIGN_OR_RETURN(bool better, want_max ? py_less(best_key, key) : py_less(key, best_key));
    if (better) {
      best = i;
      best_key = std::move(key);
    }
  }
  return items[best];
}

Result<Value> f_min(Interpreter& i, const Value& in, CallArgs& a) {
  return min_or_max(i, in, a, false);
}
Result<Value> f_max(Interpreter& i, const Value& in, CallArgs& a) {
  return min_or_max(i, in, a, true);
}

Result<Value> f_sum(Interpreter& interp, const Value& in, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(
      auto a, bind_args("sum", args, {{"attribute", Value::none()}, {"start", Value::integer(0)}}));
  if (a[1].is_string()) return type_error("sum() can't sum strings [use ''.join(seq) instead]");
  SE_ASSIGN_OR_RETURN(std::vector<Value> items, interp.iterate(in));
  SE_ASSIGN_OR_RETURN(items, attribute_values(interp, std::move(items), a[0]));
  Value total = a[1];
  for (const Value& item : items) {
    SE_ASSIGN_OR_RETURN(total, binary_op(interp, ast::BinaryOp::kAdd, total, item));
  }
  return total;
}

}  // namespace

Value ignore_case(const Value& v) {
  if (v.is_string()) return Value::string(py_lower(v.as_string()));
  return v;
}

Result<Value> get_attribute_path(Interpreter& interp, const Value& item, const Value& attribute,
                                 const std::optional<Value>& default_value) {
  if (attribute.is_none()) return item;
  std::vector<Value> parts;
  if (attribute.is_string()) {
    const std::string& spec = attribute.as_string();
    size_t start = 0;
    while (true) {
      size_t dot = spec.find('.', start);
      std::string part = spec.substr(start, dot - start);
      bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                                 [](char c) { return c >= '0' && c <= '9'; });
      parts.push_back(digits && part.size() < 18 ? Value::integer(std::stoll(part))
                                                 : Value::string(part));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
  } else {
    parts.push_back(attribute);
  }
  Value current = item;
  for (const Value& part : parts) {
    SE_ASSIGN_OR_RETURN(current, interp.get_item(current, part));
    if (default_value && current.is_undefined()) current = *default_value;
  }
  return current;
}

Result<std::vector<Value>> sorted_by_keys(std::vector<Value> items, std::vector<Value> keys,
                                          bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  Status failure;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    if (!failure.is_ok()) return false;
    Result<bool> less = reverse ? py_less(keys[y], keys[x]) : py_less(keys[x], keys[y]);
    if (!less.is_ok()) {
      failure = less.status();
      return false;
    }
    return *less;
  });
  SE_RETURN_IF_ERROR(failure);
  std::vector<Value> out;
  out.reserve(items.size());
  for (size_t i : order) out.push_back(std::move(items[i]));
  return out;
}

FilterFn find_sequence_filter(std::string_view name) {
  struct Entry {
    std::string_view name;
    FilterFn fn;
  };
  static constexpr Entry kFilters[] = {
      {"length", f_length},   {"count", f_length}, {"first", f_first},       {"last", f_last},
      {"join", f_join},       {"list", f_list},    {"dictsort", f_dictsort}, {"sort", f_sort},
      {"reverse", f_reverse}, {"min", f_min},      {"max", f_max},           {"sum", f_sum},
  };
  for (const Entry& e : kFilters) {
    if (e.name == name) return e.fn;
  }
  return find_lazy_filter(name);
}

}  // namespace se::jinja
