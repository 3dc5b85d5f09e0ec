#include "server/prometheus.h"

#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <sstream>

namespace se::server {
namespace {

EngineStats sample_stats() {
  EngineStats s;
  s.num_running = 3;
  s.num_waiting = 1;
  s.num_kv_pages_total = 100;
  s.num_kv_pages_used = 25;
  s.num_kv_pages_free = 52;
  s.num_kv_pages_cached = 15;
  s.num_kv_pages_chains = 8;
  s.num_chains = 3;
  s.prefix_cache_queries_total = 400;
  s.prefix_cache_hits_total = 100;
  s.prompt_tokens_total = 400;
  s.generation_tokens_total = 64;
  s.requests_finished_total = 7;
  s.requests_aborted_total = 2;
  s.preemptions_total = 5;
  s.steps_total = 12;
  s.attended_kv_tokens_total = 34567;
  s.time_to_first_token = LatencyHistogram({0.1, 1.0});
  s.time_to_first_token.counts = {2, 3, 1};  // per bucket: <=0.1, <=1, +Inf
  s.time_to_first_token.count = 6;
  s.time_to_first_token.sum = 4.5;
  return s;
}

// Sample lines as "name{labels}" -> value text.
std::map<std::string, std::string> samples(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    out[line.substr(0, space)] = line.substr(space + 1);
  }
  return out;
}

TEST(Prometheus, EveryLineFollowsTheTextFormat) {
  const std::string text = render_prometheus(sample_stats(), "default");
  const std::regex sample_line(R"(sparse_engine_[a-z0-9_]+\{model_name="default"(,le="[^"]+")?\} -?[0-9.e+-]+)");
  const std::regex comment_line(R"(# (HELP|TYPE) sparse_engine_[a-z0-9_]+ .+)");
  std::istringstream in(text);
  std::string line;
  int num_lines = 0;
  while (std::getline(in, line)) {
    ++num_lines;
    EXPECT_TRUE(std::regex_match(line, sample_line) || std::regex_match(line, comment_line)) << line;
  }
  EXPECT_GT(num_lines, 40);
  EXPECT_EQ(text.back(), '\n');
}

TEST(Prometheus, ReportsGaugesCountersAndRates) {
  const auto s = samples(render_prometheus(sample_stats(), "default"));
  const std::string l = "{model_name=\"default\"}";
  EXPECT_EQ(s.at("sparse_engine_num_requests_running" + l), "3");
  EXPECT_EQ(s.at("sparse_engine_num_requests_waiting" + l), "1");
  EXPECT_EQ(s.at("sparse_engine_kv_pages_total" + l), "100");
  EXPECT_EQ(s.at("sparse_engine_kv_pages_used" + l), "25");
  EXPECT_EQ(s.at("sparse_engine_kv_pages_free" + l), "52");
  EXPECT_EQ(s.at("sparse_engine_kv_pages_cached" + l), "15");
  EXPECT_EQ(s.at("sparse_engine_kv_pages_chains" + l), "8");
  EXPECT_EQ(s.at("sparse_engine_num_chains" + l), "3");
  EXPECT_EQ(s.at("sparse_engine_kv_cache_usage_perc" + l), "0.25");
  EXPECT_EQ(s.at("sparse_engine_prefix_cache_hit_rate" + l), "0.25");
  EXPECT_EQ(s.at("sparse_engine_prefix_cache_hits_total" + l), "100");
  EXPECT_EQ(s.at("sparse_engine_prefix_cache_queries_total" + l), "400");
  EXPECT_EQ(s.at("sparse_engine_prompt_tokens_total" + l), "400");
  EXPECT_EQ(s.at("sparse_engine_generation_tokens_total" + l), "64");
  EXPECT_EQ(s.at("sparse_engine_requests_finished_total" + l), "7");
  EXPECT_EQ(s.at("sparse_engine_requests_aborted_total" + l), "2");
  EXPECT_EQ(s.at("sparse_engine_preemptions_total" + l), "5");
  EXPECT_EQ(s.at("sparse_engine_engine_steps_total" + l), "12");
  EXPECT_EQ(s.at("sparse_engine_attended_kv_tokens_total" + l), "34567");
}

TEST(Prometheus, HistogramBucketsAreCumulative) {
  const auto s = samples(render_prometheus(sample_stats(), "default"));
  const std::string name = "sparse_engine_time_to_first_token_seconds";
  EXPECT_EQ(s.at(name + "_bucket{model_name=\"default\",le=\"0.1\"}"), "2");
  EXPECT_EQ(s.at(name + "_bucket{model_name=\"default\",le=\"1\"}"), "5");
  EXPECT_EQ(s.at(name + "_bucket{model_name=\"default\",le=\"+Inf\"}"), "6");
  EXPECT_EQ(s.at(name + "_sum{model_name=\"default\"}"), "4.5");
  EXPECT_EQ(s.at(name + "_count{model_name=\"default\"}"), "6");
  EXPECT_EQ(s.count("sparse_engine_e2e_request_latency_seconds_count{model_name=\"default\"}"), 1u);
  EXPECT_EQ(s.count("sparse_engine_inter_token_latency_seconds_count{model_name=\"default\"}"), 1u);
}

TEST(Prometheus, ZeroQueriesGiveAZeroHitRateAndLabelsAreEscaped) {
  const EngineStats empty;
  const std::string text = render_prometheus(empty, "a\"b\\c\nd");
  const auto s = samples(text);
  EXPECT_EQ(s.at("sparse_engine_prefix_cache_hit_rate{model_name=\"a\\\"b\\\\c\\nd\"}"), "0");
  EXPECT_EQ(s.at("sparse_engine_kv_cache_usage_perc{model_name=\"a\\\"b\\\\c\\nd\"}"), "0");
}

}  // namespace
}  // namespace se::server
