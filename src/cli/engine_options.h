// The engine flags (vLLM names) shared by every command that builds an Engine (`serve`, `generate`,
// `bench throughput`): KV pool sizing, step bounds, prefix caching, and the sparse method with its
// hyperparameters, and the device. check_sparse_options() validates the method before any model is loaded.
#pragma once

#include <CLI/CLI.hpp>

#include "base/status.h"
#include "engine/engine_config.h"

namespace se::cli {

// Registers --device on `command` (cpu, cuda, or auto: cuda when a Hopper GPU is visible), written into `device`
// once the command line is read; a device this build or machine cannot use is a CLI usage error.
// check_usable: refuse --device cuda at parse time when no usable GPU is visible (a command that may not touch the
// device, such as `eval --report-only`, checks when it needs to).
void add_device_option(CLI::App& command, Device& device, bool check_usable = true);

// Registers the flags on `command`; they write into `config`. --sparse-config must be a JSON object (a
// parse error is a CLI usage error, exit code 2).
void add_engine_options(CLI::App& command, EngineConfig& config);

// Builds the method once from --sparse-method / --sparse-config and drops it: an unknown method, unknown key
// or out-of-range value comes back as kInvalidArgument naming it; a method that cannot run on --device as
// kUnimplemented naming the missing ops; an unknown --kv-cache-dtype, or a store the method or the device cannot
// use, as check_kv_store_supports says; a --kivi-group-size / --kivi-residual a KIVI store cannot hold as
// kInvalidArgument.
Status check_sparse_options(const EngineConfig& config);

// Prints "error: <message>" to stderr and returns 2 (a usage error).
int report_usage_error(const Status& status);

}  // namespace se::cli
