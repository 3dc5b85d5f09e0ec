// Renders every snippet of jinja_cases.json (expected outputs produced by Python jinja2 through
// gen_jinja_expected.py) and compares byte for byte; where jinja2 raised, we must fail too, with
// the same message for raise_exception.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "base/mapped_file.h"
#include "chat/jinja/template.h"

namespace se::jinja {
namespace {

using Json = nlohmann::ordered_json;

Json load_cases() {
  Result<std::string> text = read_file(std::string(SE_SOURCE_DIR) + "/tests/chat/jinja_cases.json");
  EXPECT_TRUE(text.is_ok()) << text.status().to_string();
  return text.is_ok() ? Json::parse(*text) : Json::array();
}

TEST(JinjaCasesTest, MatchesJinja2) {
  Json cases = load_cases();
  ASSERT_GT(cases.size(), 150u);
  int num_ok = 0;
  int num_errors = 0;
  for (const Json& c : cases) {
    const std::string name = c["name"].get<std::string>();
    const Json& expected = c["expected"];
    Result<std::string> out = [&]() -> Result<std::string> {
      SE_ASSIGN_OR_RETURN(Template tmpl, Template::parse(c["template"].get<std::string>()));
      return tmpl.render(c["variables"]);
    }();
    if (expected["ok"].get<bool>()) {
      ++num_ok;
      if (!out.is_ok()) {
        ADD_FAILURE() << name << ": jinja2 rendered " << expected["output"]
                      << " but we failed: " << out.status().to_string();
      } else {
        EXPECT_EQ(*out, expected["output"].get<std::string>()) << name;
      }
    } else {
      ++num_errors;
      if (out.is_ok()) {
        ADD_FAILURE() << name << ": jinja2 raised " << expected["error_type"] << ": "
                      << expected["message"] << " but we rendered '" << *out << "'";
      } else if (expected["error_type"] == "TemplateError") {
        EXPECT_EQ(out.status().message(), expected["message"].get<std::string>()) << name;
      }
    }
  }
  EXPECT_GT(num_ok, 100);
  EXPECT_GT(num_errors, 15);
}

}  // namespace
}  // namespace se::jinja
