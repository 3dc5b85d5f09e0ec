// What an eviction keeps of a sliding-window layer's stream.
//
// Attention applies a layer's window W to the last W slots its stream stores, not to token positions. A kept
// token older than the window would sit inside those slots and show the layer a key from beyond its trained
// reach (an attention sink above all), while the query at the next position can see only the last W - 1 stored
// positions anyway. So every eviction method keeps a contiguous tail on such a layer: with no gaps, the last W
// slots are exactly the last W positions, and appending decode tokens keeps it so. (HF's sliding-window cache holds
// just that tail, and kvpress leaves those layers uncompressed.)
#pragma once

#include <cstdint>
#include <vector>

namespace se {

// Sets `kept` to the newest min(count, sliding_window - 1, num_tokens) of positions [0, num_tokens), ascending.
void keep_sliding_window_tail(int32_t num_tokens, int32_t sliding_window, int32_t count, std::vector<int32_t>& kept);

}  // namespace se
