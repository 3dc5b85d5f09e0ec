// `sparse-engine methods`: every method of the registry with its family, traits and default hyperparameters
// (the resolved configuration of the method built with no --sparse-config). It learns everything from the
// registry and the methods' traits (which compositions are valid included); no method is named here. --json prints the
// same as a JSON array.
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "sparse/method_registry.h"
#include "sparse/method_traits.h"

namespace se::cli {

namespace {

Result<nlohmann::ordered_json> describe(const MethodInfo& info) {
  auto method = create_method(info.name, nullptr);
  if (!method.is_ok())
    return internal_error("method '{}' cannot be built with its defaults: {}", info.name, method.status().message());
  const MethodTraits& traits = (*method)->traits();
  std::vector<std::string> ops;
  for (OpId op : traits.ops) ops.emplace_back(op_name(op));
  // The --kv-cache-dtype stores the method can keep its KV in, on the CPU and (in a build with it) on CUDA.
  std::vector<std::string> stores, cuda_stores;
  const bool runs_on_cuda = check_runs_on(Device::kCuda, traits, info.name).is_ok();
  for (KvStoreKind store : kKvStoreKinds) {
    if (check_kv_store_supports(store, Device::kCpu, traits, info.name).is_ok())
      stores.emplace_back(kv_store_kind_name(store));
    if (runs_on_cuda && check_kv_store_supports(store, Device::kCuda, traits, info.name).is_ok())
      cuda_stores.emplace_back(kv_store_kind_name(store));
  }
  return nlohmann::ordered_json{
      {"name", info.name},
      {"summary", info.summary},
      {"family", family_name(traits.family)},
      {"keeps_full_history", traits.keeps_full_history},
      {"ops", ops},
      {"static_decode_forward", traits.static_decode_forward},
      {"prefix_mode", prefix_mode_name(traits.prefix_mode)},
      {"prefill_policy", prefill_policy_name(traits.prefill_policy)},
      {"selection_unit", (*method)->traits().selection_unit == SelectionUnit::kPage ? "page" : "token"},
      {"kv_cache_dtypes", stores},
      {"cuda_kv_cache_dtypes", cuda_stores},
      {"latent_attention_store", keeps_shared_latent(traits) ? "shared latent" : "expanded heads"},
      {"latent_attention_on_cuda",
       runs_on_cuda && check_latent_attention_runs_on(Device::kCuda, traits, info.name).is_ok()},
      {"tensor_parallel", traits.tensor_parallel},
      {"evicts_sealed_groups", traits.evicts_sealed_groups},
      {"kv_partitions", (*method)->partition_config().has_value()},
      {"composition", composition_name(info.composition)},
      {"defaults", (*method)->config()},
  };
}

int run_methods(bool as_json) {
  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  for (const MethodInfo& info : registered_methods()) {
    auto described = describe(info);
    if (!described.is_ok()) {
      std::fprintf(stderr, "error: %s\n", described.status().message().c_str());
      return 1;
    }
    all.push_back(std::move(*described));
  }
  if (as_json) {
    std::printf("%s\n", all.dump(2).c_str());
    return 0;
  }
  std::printf(
      "| method | family | keeps full history | ops | prefix mode | prefill policy | kv cache dtypes | "
      "on cuda | defaults |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  const auto joined = [](const nlohmann::ordered_json& names) {
    std::string out;
    for (const auto& name : names) out += (out.empty() ? "" : ", ") + name.get<std::string>();
    return out.empty() ? std::string("-") : out;
  };
  for (const auto& m : all) {
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | `%s` |\n", m["name"].get<std::string>().c_str(),
                m["family"].get<std::string>().c_str(), m["keeps_full_history"].get<bool>() ? "yes" : "no",
                joined(m["ops"]).c_str(), m["prefix_mode"].get<std::string>().c_str(),
                m["prefill_policy"].get<std::string>().c_str(), joined(m["kv_cache_dtypes"]).c_str(),
                joined(m["cuda_kv_cache_dtypes"]).c_str(), m["defaults"].dump().c_str());
  }
  std::printf("\n");
  for (const auto& m : all)
    std::printf("%s: %s\n", m["name"].get<std::string>().c_str(), m["summary"].get<std::string>().c_str());
  std::string latent, latent_cuda;
  for (const auto& m : all) {
    if (m["latent_attention_store"] == "shared latent")
      latent += (latent.empty() ? "" : ", ") + m["name"].get<std::string>();
    if (m["latent_attention_on_cuda"].get<bool>())
      latent_cuda += (latent_cuda.empty() ? "" : ", ") + m["name"].get<std::string>();
  }
  std::printf(
      "\nOn latent-attention (MLA) models %s keep%s one shared latent row per token; the other methods keep "
      "every head's expanded K/V, on the CPU only. On CUDA such a model runs under %s.\n",
      latent.c_str(), latent.find(',') == std::string::npos ? "s" : "",
      latent_cuda.empty() ? "no method in this build" : latent_cuda.c_str());
  std::string split;
  for (const auto& m : all)
    if (m["tensor_parallel"].get<bool>()) split += (split.empty() ? "" : ", ") + m["name"].get<std::string>();
  std::printf("\nUnder --tensor-parallel-size above 1 run %s (each rank over its KV heads).\n", split.c_str());
  std::string partitioned;
  for (const auto& m : all)
    if (m["kv_partitions"].get<bool>()) partitioned += (partitioned.empty() ? "" : ", ") + m["name"].get<std::string>();
  std::printf(
      "Under --kv-partitions (running requests' KV in the host tier, Spin's partitions; CPU) run %s: a request's KV "
      "may exceed the device pool, and with --prefix-cache-mode chain a finished turn stays whole in the tier.\n",
      partitioned.c_str());
  std::string decode_time, prompt_time;
  for (const auto& m : all) {
    std::string& names = m["composition"] == "decode-time" ? decode_time : prompt_time;
    if (m["composition"] != "none") names += (names.empty() ? "" : ", ") + m["name"].get<std::string>();
  }
  std::printf(
      "\nCompositions: a decode-time method (%s) compresses the prompt with a prompt-time method (%s) given in its "
      "--sparse-config as {\"prompt_method\": NAME, \"prompt_config\": {...}}; no other pairing is valid.\n",
      decode_time.c_str(), prompt_time.c_str());
  // The selection methods a quantized store takes read it on the CPU only; the other methods it takes run on both.
  std::string over_kivi, sealed_groups, selecting_over_quantized;
  for (const auto& m : all) {
    const bool selects = m["family"] == family_name(MethodFamily::kDynamicSelection);
    for (const auto& store : m["kv_cache_dtypes"]) {
      if (store != "kivi2") continue;
      std::string& names = selects ? selecting_over_quantized : over_kivi;
      names += (names.empty() ? "" : ", ") + m["name"].get<std::string>();
    }
    if (m["evicts_sealed_groups"].get<bool>())
      sealed_groups += (sealed_groups.empty() ? "" : ", ") + m["name"].get<std::string>();
  }
  if (!selecting_over_quantized.empty())
    std::printf(
        "\nOver FP8 and KIVI pages %s select%s pages on the CPU only: FP8 pages are bounded over the keys their codes "
        "decode to; over KIVI a page is a key group (--kivi-group-size tokens, whatever --page-size says), bounded "
        "from its codes once quantized and from its rows while its keys are in the window. The selected pages are read "
        "through the store's own attention.\n",
        selecting_over_quantized.c_str(), selecting_over_quantized.find(',') == std::string::npos ? "s" : "");
  std::printf(
      "\nKIVI (--kv-cache-dtype kivi2|kivi4) runs under %s, on the CPU and on CUDA (where the window is written, its "
      "groups quantized and the kept rows moved on the device): a compress-after method scores and evicts the prompt "
      "while the store holds it at full precision, and only the kept tokens are quantized; %s, evicting as decode "
      "runs, "
      "drop%s whole quantized groups, each once its keys and values have left the window (each method's rule over "
      "groups is in docs/fidelity.md); one whose rule scores the quantized groups runs on the CPU only "
      "(attention_scores reads them there). Other methods that "
      "evict during decode, or select single tokens, are refused over KIVI, as are ops that read explicit K/V pages; "
      "every refused pairing of a method and a store fails before the model loads (exit 2) with "
      "the reason. Over KIVI the Chain Cache keeps a chain's "
      "quantized groups and residual windows between turns (--prefix-cache-mode chain, or auto for a method with a "
      "chain mode; a resumed turn appends its tokens as KIVI appends decode tokens, compressing again only while "
      "nothing is quantized); the radix prefix cache is refused, since a window slides and flushes into groups of "
      "one sequence's tokens.\n",
      over_kivi.c_str(), sealed_groups.c_str(), sealed_groups.find(',') == std::string::npos ? "s" : "");
  return 0;
}

}  // namespace

void add_methods_command(CLI::App& app, int& exit_code) {
  auto as_json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("methods", "list the sparse methods with their family, traits and defaults");
  cmd->add_flag("--json", *as_json, "print a JSON array instead of a table");
  cmd->callback([as_json, &exit_code] { exit_code = run_methods(*as_json); });
}

}  // namespace se::cli
