// EngineRank: what one tensor-parallel rank of the engine owns: the method instance that decides over the rank's KV
// heads, the cache that holds them, the controller that joins the two as the hooks of the rank's part of the
// model, and the runner of its forwards. An unsharded engine has one rank. Rank 0's runner samples; the other ranks'
// run the same planned step without sampling (ModelRunner::follow). The engine thread drives rank 0 and touches
// every rank's cache between steps; RankWorkers run the other ranks' steps.
#pragma once

#include <memory>

#include "engine/model_runner.h"
#include "sparse/sparse_controller.h"

namespace se {

struct EngineRank {
  EngineRank(const Model& model, std::unique_ptr<MethodRuntime> rank_method, std::unique_ptr<CacheManager> rank_cache,
             ForwardWorkspace workspace, bool use_cuda_graphs)
      : method(std::move(rank_method)),
        cache(std::move(rank_cache)),
        controller(*method, *cache, model.device()),
        runner(model, controller, std::move(workspace), use_cuda_graphs) {}
  EngineRank(const EngineRank&) = delete;
  EngineRank& operator=(const EngineRank&) = delete;

  std::unique_ptr<MethodRuntime> method;
  std::unique_ptr<CacheManager> cache;
  SparseController controller;
  ModelRunner runner;
};

}  // namespace se
