// The generator filters: items, unique, batch, map, select, reject, selectattr, rejectattr. In
// jinja2 these are Python generator functions, so nothing runs (not even argument checks) until
// the result is iterated, and each pull computes one item. These filters mirror that exactly.
#include <algorithm>

#include "chat/jinja/builtin_args.h"
#include "chat/jinja/builtins_internal.h"
#include "chat/jinja/generators.h"
#include "chat/jinja/interpreter.h"
#include "chat/jinja/operators.h"
#include "chat/jinja/py_format.h"

namespace se::jinja {
namespace {

using Produce = std::function<Result<std::optional<Value>>(Interpreter&)>;
using Start = std::function<Result<Produce>(Interpreter&)>;

Produce nothing() {
  return [](Interpreter&) -> Result<std::optional<Value>> { return std::optional<Value>(); };
}

// A generator whose body starts on the first pull: `start` does the filter's set-up (and may
// fail), then the Produce it returns yields one item per pull.
Value lazy_generator(Interpreter& interp, std::string origin, Start start) {
  Produce body;
  return interp.track(Value::generator(
      [start = std::move(start), body](Interpreter& i) mutable -> Result<std::optional<Value>> {
        if (!body) {
          SE_ASSIGN_OR_RETURN(body, start(i));
        }
        return body(i);
      },
      std::move(origin)));
}

Result<std::shared_ptr<PyIterator>> iterate_lazily(const Value& v) {
  SE_ASSIGN_OR_RETURN(PyIterator it, PyIterator::over(v));
  return std::make_shared<PyIterator>(std::move(it));
}

Result<Value> f_items(Interpreter& interp, const Value& in, CallArgs& args) {
  SE_RETURN_IF_ERROR(bind_args("items", args, {}).status());
  return lazy_generator(interp, "do_items", [in](Interpreter&) -> Result<Produce> {
    if (in.is_undefined()) return nothing();
    if (in.kind() != ValueKind::kDict) return type_error("Can only get item pairs from a mapping.");
    auto pos = std::make_shared<size_t>(0);
    return Produce([in, pos](Interpreter&) -> Result<std::optional<Value>> {
      const auto& items = in.as_dict().items();
      if (*pos >= items.size()) return std::optional<Value>();
      const auto& [key, value] = items[(*pos)++];
      return std::optional<Value>(Value::tuple({key, value}));
    });
  });
}

Status check_hashable(const Value& v) {
  if (v.kind() == ValueKind::kList || v.kind() == ValueKind::kDict) {
    return type_error(fmt::format("unhashable type: '{}'", py_type_name(v)));
  }
  if (v.kind() == ValueKind::kTuple) {
    for (const Value& item : v.items()) SE_RETURN_IF_ERROR(check_hashable(item));
  }
  return Status::ok();
}

Result<Value> f_unique(Interpreter& interp, const Value& in, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(
      auto a, bind_args("unique", args,
                        {{"case_sensitive", Value::boolean(false)}, {"attribute", Value::none()}}));
  return lazy_generator(interp, "sync_do_unique", [in, a](Interpreter&) -> Result<Produce> {
    SE_ASSIGN_OR_RETURN(auto source, iterate_lazily(in));
    auto seen = std::make_shared<std::vector<Value>>();
    return Produce([source, seen, a](Interpreter& interp) -> Result<std::optional<Value>> {
      while (true) {
        SE_ASSIGN_OR_RETURN(std::optional<Value> item, source->next(interp));
        if (!item) return item;
        SE_ASSIGN_OR_RETURN(Value key, get_attribute_path(interp, *item, a[1], std::nullopt));
        if (!a[0].truthy()) key = ignore_case(key);
        SE_RETURN_IF_ERROR(check_hashable(key));
        if (std::none_of(seen->begin(), seen->end(),
                         [&](const Value& s) { return py_equal(s, key); })) {
          seen->push_back(std::move(key));
          return item;
        }
      }
    });
  });
}

Result<Value> f_batch(Interpreter& interp, const Value& in, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a,
                      bind_args("batch", args, {{"linecount", {}}, {"fill_with", Value::none()}}));
  return lazy_generator(interp, "do_batch", [in, a](Interpreter&) -> Result<Produce> {
    SE_ASSIGN_OR_RETURN(int64_t linecount, int_arg(a[0], "linecount"));
    SE_ASSIGN_OR_RETURN(auto source, iterate_lazily(in));
    auto tmp = std::make_shared<std::vector<Value>>();
    auto done = std::make_shared<bool>(false);
    return Produce([source, tmp, done, linecount,
                    fill = a[1]](Interpreter& interp) -> Result<std::optional<Value>> {
      while (!*done) {
        SE_ASSIGN_OR_RETURN(std::optional<Value> item, source->next(interp));
        if (!item) {
          *done = true;
          break;
        }
        std::optional<Value> full;
        if (static_cast<int64_t>(tmp->size()) == linecount) {
          full = Value::list(std::move(*tmp));
          tmp->clear();
        }
        tmp->push_back(std::move(*item));
        if (full) return full;
      }
      if (tmp->empty()) return std::optional<Value>();
      if (!fill.is_none() && static_cast<int64_t>(tmp->size()) < linecount) {
        SE_RETURN_IF_ERROR(interp.check_string_size(static_cast<size_t>(linecount)));
        tmp->resize(static_cast<size_t>(linecount), fill);
      }
      Value last = Value::list(std::move(*tmp));
      tmp->clear();
      return std::optional<Value>(std::move(last));
    });
  });
}

// jinja2's prepare_map: map(attribute=..., default=...) or map('filter', args...).
Result<std::function<Result<Value>(Interpreter&, const Value&)>> prepare_map(const CallArgs& args) {
  bool by_attribute = args.positional.empty() &&
                      std::any_of(args.keyword.begin(), args.keyword.end(),
                                  [](const auto& kw) { return kw.first == "attribute"; });
  if (by_attribute) {
    Value attribute;
    std::optional<Value> default_value;
    for (const auto& [key, value] : args.keyword) {
      if (key == "attribute") {
        attribute = value;
      } else if (key == "default") {
        if (!value.is_none()) default_value = value;
      } else {
        return invalid_argument("FilterArgumentError: Unexpected keyword argument {}",
                                py_repr_string(key));
      }
    }
    return std::function<Result<Value>(Interpreter&, const Value&)>(
        [attribute, default_value](Interpreter& interp, const Value& item) {
          return get_attribute_path(interp, item, attribute, default_value);
        });
  }
  if (args.positional.empty()) {
    return invalid_argument("FilterArgumentError: map requires a filter argument");
  }
  std::string name = py_str(args.positional[0]);
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  return std::function<Result<Value>(Interpreter&, const Value&)>(
      [name, rest](Interpreter& interp, const Value& item) {
        return interp.call_filter(name, item, rest);
      });
}

Result<Value> f_map(Interpreter& interp, const Value& in, CallArgs& args) {
  return lazy_generator(interp, "sync_do_map", [in, args](Interpreter&) -> Result<Produce> {
    if (!in.truthy()) return nothing();
    SE_ASSIGN_OR_RETURN(auto func, prepare_map(args));
    SE_ASSIGN_OR_RETURN(auto source, iterate_lazily(in));
    return Produce([source, func](Interpreter& interp) -> Result<std::optional<Value>> {
      SE_ASSIGN_OR_RETURN(std::optional<Value> item, source->next(interp));
      if (!item) return item;
      SE_ASSIGN_OR_RETURN(Value mapped, func(interp, *item));
      return std::optional<Value>(std::move(mapped));
    });
  });
}

// select / reject / selectattr / rejectattr: keep the items whose test (or truthiness, without a
// test name) passes, or fails for the reject forms.
Result<Value> select_or_reject(Interpreter& interp, const Value& in, const CallArgs& args,
                               bool keep_passing, bool lookup_attr) {
  Start start = [in, args, keep_passing, lookup_attr](Interpreter&) -> Result<Produce> {
    if (!in.truthy()) return nothing();
    size_t off = 0;
    Value attribute = Value::none();
    if (lookup_attr) {
      if (args.positional.empty()) {
        return invalid_argument("FilterArgumentError: Missing parameter for attribute name");
      }
      attribute = args.positional[0];
      off = 1;
    }
    std::optional<std::string> test;
    CallArgs test_args;
    if (args.positional.size() > off) {
      test = py_str(args.positional[off]);
      test_args.positional.assign(args.positional.begin() + static_cast<ptrdiff_t>(off) + 1,
                                  args.positional.end());
      test_args.keyword = args.keyword;
    }
    SE_ASSIGN_OR_RETURN(auto source, iterate_lazily(in));
    return Produce([=](Interpreter& interp) -> Result<std::optional<Value>> {
      while (true) {
        SE_ASSIGN_OR_RETURN(std::optional<Value> item, source->next(interp));
        if (!item) return item;
        SE_RETURN_IF_ERROR(interp.count_step());
        Value subject = *item;
        if (lookup_attr) {
          SE_ASSIGN_OR_RETURN(subject, get_attribute_path(interp, *item, attribute, std::nullopt));
        }
        bool passed;
        if (test) {
          SE_ASSIGN_OR_RETURN(passed, interp.call_test(*test, subject, test_args));
        } else {
          passed = subject.truthy();
        }
        if (passed == keep_passing) return item;
      }
    });
  };
  return lazy_generator(interp, "select_or_reject", std::move(start));
}

Result<Value> f_select(Interpreter& i, const Value& in, CallArgs& a) {
  return select_or_reject(i, in, a, true, false);
}
Result<Value> f_reject(Interpreter& i, const Value& in, CallArgs& a) {
  return select_or_reject(i, in, a, false, false);
}
Result<Value> f_selectattr(Interpreter& i, const Value& in, CallArgs& a) {
  return select_or_reject(i, in, a, true, true);
}
Result<Value> f_rejectattr(Interpreter& i, const Value& in, CallArgs& a) {
  return select_or_reject(i, in, a, false, true);
}

}  // namespace

FilterFn find_lazy_filter(std::string_view name) {
  struct Entry {
    std::string_view name;
    FilterFn fn;
  };
  static constexpr Entry kFilters[] = {
      {"items", f_items},           {"unique", f_unique},
      {"batch", f_batch},           {"map", f_map},
      {"select", f_select},         {"reject", f_reject},
      {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr},
  };
  for (const Entry& e : kFilters) {
    if (e.name == name) return e.fn;
  }
  return nullptr;
}

}  // namespace se::jinja
