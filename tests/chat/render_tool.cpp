// render_tool: renders chat templates or plain Jinja snippets with se::ChatTemplate /
// jinja::Template so the Python tests can compare against jinja2 and transformers byte for byte.
//
//   render_tool TEMPLATE_FILE INPUT_JSON   one chat case: {"messages": [...], "options": {...}};
//                                          prints the rendering, or the error on stderr (exit 1)
//   render_tool --batch CASES_JSON         a list of cases, each with "template" (source text) or
//                                          "template_path", and either "messages" + "options"
//                                          (chat) or "variables" (plain Jinja); prints a JSON list
//                                          of {"ok": true, "output": ...} / {"ok": false, "error":
//                                          ...}
//
// Options: add_generation_prompt, bos_token, eos_token, tools, extra (object of variables),
// now ("YYYY-MM-DD HH:MM:SS", the time strftime_now reports), max_steps, max_output_bytes.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "base/mapped_file.h"
#include "chat/chat_template.h"
#include "chat/jinja/template.h"

namespace {

using se::Result;
using Json = nlohmann::ordered_json;

Result<se::ChatTemplateOptions> parse_options(const Json& j) {
  se::ChatTemplateOptions opts;
  if (j.is_null()) return opts;
  if (!j.is_object()) return se::invalid_argument("options must be an object");
  opts.add_generation_prompt = j.value("add_generation_prompt", false);
  if (j.contains("bos_token")) opts.bos_token = j["bos_token"].get<std::string>();
  if (j.contains("eos_token")) opts.eos_token = j["eos_token"].get<std::string>();
  if (j.contains("tools")) opts.tools = j["tools"];
  if (j.contains("extra")) opts.extra_variables = j["extra"];
  if (j.contains("max_steps")) opts.limits.max_steps = j["max_steps"].get<uint64_t>();
  if (j.contains("max_output_bytes"))
    opts.limits.max_output_bytes = j["max_output_bytes"].get<size_t>();
  if (j.contains("now")) {
    std::tm tm{};
    std::string now = j["now"].get<std::string>();
    if (std::sscanf(now.c_str(), "%d-%d-%d %d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                    &tm.tm_hour, &tm.tm_min, &tm.tm_sec) != 6) {
      return se::invalid_argument("now must look like YYYY-MM-DD HH:MM:SS, got '{}'", now);
    }
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    std::tm copy = tm;
    timegm(&copy);  // fills tm_wday / tm_yday for %a, %j, ...
    tm.tm_wday = copy.tm_wday;
    tm.tm_yday = copy.tm_yday;
    opts.now = tm;
  }
  return opts;
}

Result<std::string> render_case(const Json& c) {
  std::string source;
  if (c.contains("template")) {
    source = c["template"].get<std::string>();
  } else {
    SE_ASSIGN_OR_RETURN(source, se::read_file(c["template_path"].get<std::string>()));
  }
  SE_ASSIGN_OR_RETURN(se::ChatTemplateOptions opts, parse_options(c.value("options", Json())));
  if (c.contains("variables")) {
    SE_ASSIGN_OR_RETURN(se::jinja::Template tmpl, se::jinja::Template::parse(source));
    se::jinja::RenderOptions render_options;
    render_options.limits = opts.limits;
    render_options.now = opts.now;
    return tmpl.render(c["variables"], render_options);
  }
  SE_ASSIGN_OR_RETURN(se::ChatTemplate tmpl, se::ChatTemplate::parse(source));
  return tmpl.render(c.value("messages", Json::array()), opts);
}

Result<Json> read_json(const std::string& path) {
  SE_ASSIGN_OR_RETURN(std::string text, se::read_file(path));
  Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded()) return se::invalid_argument("{}: not valid JSON", path);
  return j;
}

int run_batch(const std::string& path) {
  Result<Json> cases = read_json(path);
  if (!cases.is_ok()) {
    std::cerr << cases.status().to_string() << "\n";
    return 2;
  }
  Json results = Json::array();
  for (const Json& c : *cases) {
    Result<std::string> out = render_case(c);
    if (out.is_ok()) {
      results.push_back({{"ok", true}, {"output", *out}});
    } else {
      results.push_back({{"ok", false},
                         {"code", se::status_code_name(out.status().code())},
                         {"error", out.status().message()}});
    }
  }
  std::cout << results.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--batch") return run_batch(argv[2]);
  if (argc != 3) {
    std::cerr << "usage: render_tool TEMPLATE_FILE INPUT_JSON | render_tool --batch CASES_JSON\n";
    return 2;
  }
  Result<Json> input = read_json(argv[2]);
  if (!input.is_ok()) {
    std::cerr << input.status().to_string() << "\n";
    return 2;
  }
  Json c = *input;
  c["template_path"] = argv[1];
  Result<std::string> out = render_case(c);
  if (!out.is_ok()) {
    std::cerr << out.status().message() << "\n";
    return 1;
  }
  std::fwrite(out->data(), 1, out->size(), stdout);
  return 0;
}
