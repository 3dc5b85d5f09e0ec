// quant_tool: runs the KV quantizers on inputs from files and writes their raw outputs, for test_quant_oracles.py
// to compare against the numpy oracles in oracles/{fp8,kivi,turboquant}.py. Files are raw little-endian arrays.
//   fp8 FMT SCALE IN.f32 OUT.u8             codes of IN / SCALE (FMT e4m3 | e5m2)
//   fp8_decode FMT SCALE IN.u8 OUT.f32      float(code) * SCALE
//   fp8_scales K.f32 V.f32 OUT.f32          calculate_kv_scales: (k_scale, v_scale)
//   kivi key|value BITS GROUP T D IN.f32 PREFIX
//       IN [T, D] of one head; keys: one row per channel over T tokens, values: one row per token over D channels;
//       writes PREFIX.codes (u32 [rows][words]), .scale, .mn (fp16 [rows][groups]), .deq (f32 [T, D])
//   kivi_stream BITS GROUP R D K.f32 V.f32 PREFIX CHUNK...
//       appends K/V [sum(CHUNK), D] chunk by chunk through the residual window, quantizing what it flushes;
//       writes PREFIX.kcodes/.kscale/.kmn (per channel over the quantized keys), .vcodes/.vscale/.vmn (per
//       quantized token) and prints "quantized_keys quantized_values"
//   kivi_evicted BITS GROUP R D K.f32 V.f32 KEPT.i32 PREFIX CHUNK...
//       the KIVI store of one stream under a compress-after method: the prompt K/V [sum(CHUNK), D] written chunk by
//       chunk and held, evicted to the ascending token indices KEPT, then reported computed; writes the store's
//       quantized keys and values in kivi_stream's files and prints "quantized_keys quantized_values"
//   turboquant mse|prod BITS SEED N D IN.f32 PREFIX
//       PREFIX.rot (f64 [D, D]), .centroids (f64), .codes (u8 [N][bytes]), .norm (fp16 [N]), .deq (f32 [N, D]);
//       prod also .qjl (f64 S [D, D]), .signs (u8 [N][bytes]), .rnorm (fp16 [N])
//   turboquant_split BITS SEED N D NUM_OUTLIERS IN.f32 PREFIX
//       outliers picked over all N vectors: PREFIX.outliers (i32), .rot_out, .rot_reg, .codes, .norm ([N][2]), .deq
//   turboquant_kv PRESET N D K.f32 V.f32 PREFIX
//       the store's slots of N tokens (PRESET a turboquant_* --kv-cache-dtype): PREFIX.slots (u8 [N][slot bytes]),
//       .k and .v (f32 [N, D], what the slots read back as), and for MSE keys .rot (f64 [D, D], the store's Pi);
//       the paper's stores (turboquant_2.5|3.5) fix the stream's outlier channels from all N tokens, as a layer's
//       first batch fixes them, and write .korder and .vorder (i32 [D]) and the store's matrices, f64:
//       .key_rot_out, .key_rot_reg, .key_qjl_out, .key_qjl_reg, .value_rot_out, .value_rot_reg
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "backend/quant/fp8_kv.h"
#include "backend/quant/kivi_quant.h"
#include "backend/quant/seeded_gaussian.h"
#include "backend/quant/turboquant.h"
#include "backend/quant/turboquant_kv.h"
#include "backend/quant/turboquant_prod_kv.h"
#include "kv/kv_store_kind.h"
#include "kv/kivi_residual_window.h"
#include "kv/turboquant_channel_table.h"
#include "model/forward_batch.h"
#include "sparse/kivi_cache_manager.h"
#include "../support/array_files.h"

using se::test::read_array;
using se::test::write_array;

namespace {

se::Fp8Format fp8_format(const std::string& name) {
  return name == "e5m2" ? se::Fp8Format::kE5M2 : se::Fp8Format::kE4M3;
}

struct KiviRows {
  int64_t words = 0, groups = 0;  // per row
  std::vector<uint32_t> codes;
  std::vector<uint16_t> scale, mn;
};

// Quantizes `rows` rows of n elements, row r starting at x + r * row_step, elements `stride` apart.
KiviRows kivi_rows(const float* x, int64_t rows, int64_t row_step, int64_t n, int64_t stride, int32_t group,
                   int32_t bits) {
  KiviRows out{se::kivi_num_words(n, bits), se::kivi_num_groups(n, group), {}, {}, {}};
  out.codes.resize(rows * out.words);
  out.scale.resize(rows * out.groups);
  out.mn.resize(rows * out.groups);
  for (int64_t r = 0; r < rows; ++r)
    se::kivi_quantize_row(x + r * row_step, n, stride, group, bits, &out.codes[r * out.words],
                          &out.scale[r * out.groups], &out.mn[r * out.groups]);
  return out;
}

int kivi(int argc, char** argv) {
  const bool keys = std::string(argv[2]) == "key";
  const int32_t bits = std::stoi(argv[3]), group = std::stoi(argv[4]);
  const int64_t t = std::stoll(argv[5]), d = std::stoll(argv[6]);
  const std::vector<float> x = read_array<float>(argv[7]);
  const std::string prefix = std::string(argv[8]) + ".";
  // Keys: row c is channel c over the T tokens (elements d apart); values: row r is token r's d channels.
  const int64_t rows = keys ? d : t, row_step = keys ? 1 : d, n = keys ? t : d, stride = keys ? d : 1;
  const KiviRows q = kivi_rows(x.data(), rows, row_step, n, stride, group, bits);
  std::vector<float> deq(t * d);
  for (int64_t r = 0; r < rows; ++r)
    se::kivi_dequantize_row(&q.codes[r * q.words], &q.scale[r * q.groups], &q.mn[r * q.groups], n, group, bits,
                            &deq[r * row_step], stride);
  write_array(prefix + "codes", q.codes);
  write_array(prefix + "scale", q.scale);
  write_array(prefix + "mn", q.mn);
  write_array(prefix + "deq", deq);
  return 0;
}

// The quantized keys' codes, scales and minima (channel by channel) and the values' (token by token), as
// test_quant_oracles.py reads them.
void write_kivi_arrays(const std::string& prefix, const std::vector<uint32_t>& kcodes,
                       const std::vector<uint16_t>& kscale, const std::vector<uint16_t>& kmn,
                       const std::vector<uint32_t>& vcodes, const std::vector<uint16_t>& vscale,
                       const std::vector<uint16_t>& vmn) {
  write_array(prefix + "kcodes", kcodes);
  write_array(prefix + "kscale", kscale);
  write_array(prefix + "kmn", kmn);
  write_array(prefix + "vcodes", vcodes);
  write_array(prefix + "vscale", vscale);
  write_array(prefix + "vmn", vmn);
}

int kivi_stream(int argc, char** argv) {
  const int32_t bits = std::stoi(argv[2]), group = std::stoi(argv[3]);
  const int64_t residual = std::stoll(argv[4]), d = std::stoll(argv[5]);
  const std::vector<float> k = read_array<float>(argv[6]), v = read_array<float>(argv[7]);
  const std::string prefix = std::string(argv[8]) + ".";
  se::KiviResidualWindow window(residual);
  // Keys: per channel, the codes of the quantized prefix grow block by block (blocks are whole words/groups).
  std::vector<std::vector<uint32_t>> kcodes(d);
  std::vector<std::vector<uint16_t>> kscale(d), kmn(d);
  std::vector<uint32_t> vcodes;
  std::vector<uint16_t> vscale, vmn;
  for (int i = 9; i < argc; ++i) {
    const se::KiviFlush f = window.append(std::stoll(argv[i]));
    const int64_t words = se::kivi_num_words(f.key_count, bits), groups = se::kivi_num_groups(f.key_count, group);
    for (int64_t c = 0; c < d && f.key_count > 0; ++c) {
      const size_t w0 = kcodes[c].size(), g0 = kscale[c].size();
      kcodes[c].resize(w0 + words);
      kscale[c].resize(g0 + groups);
      kmn[c].resize(g0 + groups);
      se::kivi_quantize_row(&k[f.key_begin * d + c], f.key_count, d, group, bits, &kcodes[c][w0], &kscale[c][g0],
                            &kmn[c][g0]);
    }
    const int64_t vwords = se::kivi_num_words(d, bits), vgroups = se::kivi_num_groups(d, group);
    for (int64_t t = f.value_begin; t < f.value_begin + f.value_count; ++t) {
      const size_t w0 = vcodes.size(), g0 = vscale.size();
      vcodes.resize(w0 + vwords);
      vscale.resize(g0 + vgroups);
      vmn.resize(g0 + vgroups);
      se::kivi_quantize_row(&v[t * d], d, 1, group, bits, &vcodes[w0], &vscale[g0], &vmn[g0]);
    }
  }
  std::vector<uint32_t> kc;
  std::vector<uint16_t> ks, km;
  for (int64_t c = 0; c < d; ++c) {
    kc.insert(kc.end(), kcodes[c].begin(), kcodes[c].end());
    ks.insert(ks.end(), kscale[c].begin(), kscale[c].end());
    km.insert(km.end(), kmn[c].begin(), kmn[c].end());
  }
  write_kivi_arrays(prefix, kc, ks, km, vcodes, vscale, vmn);
  std::printf("%lld %lld\n", static_cast<long long>(window.quantized_keys()),
              static_cast<long long>(window.quantized_values()));
  return 0;
}

int kivi_evicted(int argc, char** argv) {
  const int32_t bits = std::stoi(argv[2]), group = std::stoi(argv[3]), residual = std::stoi(argv[4]);
  const int32_t d = std::stoi(argv[5]);
  const std::vector<float> k = read_array<float>(argv[6]), v = read_array<float>(argv[7]);
  const std::vector<int32_t> kept = read_array<int32_t>(argv[8]);
  const std::string prefix = std::string(argv[9]) + ".";
  std::vector<int32_t> chunks;
  for (int i = 10; i < argc; ++i) chunks.push_back(std::stoi(argv[i]));
  int32_t len = 0, longest = 0;
  for (int32_t n : chunks) len += n, longest = std::max(longest, n);
  const se::KvLayout layout =
      se::make_kv_layout(1, 1, d, 16, se::Device::kCpu, bits == 2 ? se::KvStoreKind::kKivi2 : se::KvStoreKind::kKivi4,
                         group, residual, longest);
  auto made = se::KiviCacheManager::create(layout, 1 << 14, se::cpu_allocator(), /*hold_prompts=*/true);
  if (!made.is_ok()) {
    std::fprintf(stderr, "%s\n", made.status().to_string().c_str());
    return 1;
  }
  se::KiviCacheManager& cache = **made;
  const std::vector<int32_t> prompt(static_cast<size_t>(len), 0);
  if (!cache.open(0, prompt).is_ok()) return 1;
  int32_t begin = 0;
  for (int32_t n : chunks) {
    if (!cache.reserve(0, n).is_ok()) return 1;
    se::ForwardBatch batch;
    batch.sequences.push_back({0, 0, n});
    const se::TensorView kn{
        const_cast<float*>(&k[static_cast<size_t>(begin) * d]), se::DType::kF32, {n, 1, d}, se::Device::kCpu};
    const se::TensorView vn{
        const_cast<float*>(&v[static_cast<size_t>(begin) * d]), se::DType::kF32, {n, 1, d}, se::Device::kCpu};
    cache.write(0, cache.build_view(0, batch), kn, vn);
    begin += n;
    if (begin < len) cache.on_computed(0, prompt, begin);
  }
  const se::Status evicted = cache.evict(0, 0, 0, kept);
  if (!evicted.is_ok()) {
    std::fprintf(stderr, "%s\n", evicted.to_string().c_str());
    return 1;
  }
  cache.on_computed(0, prompt, len);
  // The stream's quantized groups, in kivi_stream's order: per channel over every quantized key, then per token.
  const se::AttentionView view = cache.build_sequence_view(0, 0);
  const se::KiviSeqView& kivi = view.quantized.kivi_seqs[0];
  const se::KiviPageLayout& pl = cache.page_layout();
  auto page = [&](int32_t g) {
    return static_cast<const char*>(view.kv_base) + static_cast<size_t>(view.seqs[0].page_ids[g]) * view.page_bytes;
  };
  const int32_t keys = kivi.num_quantized_keys[0], values = kivi.num_quantized_values[0];
  std::vector<uint32_t> kc, vc;
  std::vector<uint16_t> ks, km, vs, vm;
  for (int32_t c = 0; c < d; ++c)
    for (int32_t g = 0; g < keys / group; ++g) {
      const auto* words = reinterpret_cast<const uint32_t*>(page(g) + pl.key_codes) + int64_t{c} * pl.key_words;
      kc.insert(kc.end(), words, words + pl.key_words);
      ks.push_back(reinterpret_cast<const uint16_t*>(page(g) + pl.key_scale)[c]);
      km.push_back(reinterpret_cast<const uint16_t*>(page(g) + pl.key_min)[c]);
    }
  for (int32_t j = 0; j < values; ++j) {
    const int64_t t = j % group;
    const auto* words = reinterpret_cast<const uint32_t*>(page(j / group) + pl.value_codes) + t * pl.value_words;
    const auto* scale = reinterpret_cast<const uint16_t*>(page(j / group) + pl.value_scale) + t * pl.value_groups;
    const auto* mn = reinterpret_cast<const uint16_t*>(page(j / group) + pl.value_min) + t * pl.value_groups;
    vc.insert(vc.end(), words, words + pl.value_words);
    vs.insert(vs.end(), scale, scale + pl.value_groups);
    vm.insert(vm.end(), mn, mn + pl.value_groups);
  }
  write_kivi_arrays(prefix, kc, ks, km, vc, vs, vm);
  std::printf("%d %d\n", keys, values);
  return 0;
}

int turboquant(int argc, char** argv) {
  const bool prod = std::string(argv[2]) == "prod";
  const int32_t bits = std::stoi(argv[3]);
  const uint64_t seed = std::stoull(argv[4]);
  const int64_t n = std::stoll(argv[5]);
  const int32_t d = std::stoi(argv[6]);
  const std::vector<float> x = read_array<float>(argv[7]);
  const std::string prefix = std::string(argv[8]) + ".";
  std::vector<float> deq(n * d);
  std::vector<uint16_t> norm(n), rnorm(n);
  if (!prod) {
    const se::TurboQuantMse q(d, bits, seed);
    std::vector<uint8_t> codes(n * q.code_bytes());
    for (int64_t i = 0; i < n; ++i) {
      q.encode(&x[i * d], &codes[i * q.code_bytes()], &norm[i]);
      q.decode(&codes[i * q.code_bytes()], norm[i], &deq[i * d]);
    }
    write_array(prefix + "rot", q.rotation());
    write_array(prefix + "centroids", q.codebook().centroids);
    write_array(prefix + "codes", codes);
  } else {
    const se::TurboQuantProd q(d, bits, seed);
    const size_t cb = q.mse().code_bytes(), sb = q.qjl().sign_bytes();
    std::vector<uint8_t> codes(n * cb), signs(n * sb);
    for (int64_t i = 0; i < n; ++i) {
      q.encode(&x[i * d], &codes[i * cb], &norm[i], &signs[i * sb], &rnorm[i]);
      q.decode(&codes[i * cb], norm[i], &signs[i * sb], rnorm[i], &deq[i * d]);
    }
    write_array(prefix + "rot", q.mse().rotation());
    write_array(prefix + "centroids", q.mse().codebook().centroids);
    write_array(prefix + "codes", codes);
    write_array(prefix + "qjl", se::gaussian_matrix(d, seed + se::kQjlSeedOffset));
    write_array(prefix + "signs", signs);
    write_array(prefix + "rnorm", rnorm);
  }
  write_array(prefix + "norm", norm);
  write_array(prefix + "deq", deq);
  return 0;
}

int turboquant_split(int argc, char** argv) {
  const int32_t bits = std::stoi(argv[2]);
  const uint64_t seed = std::stoull(argv[3]);
  const int64_t n = std::stoll(argv[4]);
  const int32_t d = std::stoi(argv[5]), num_outliers = std::stoi(argv[6]);
  const std::vector<float> x = read_array<float>(argv[7]);
  const std::string prefix = std::string(argv[8]) + ".";
  const std::vector<int32_t> outliers = se::select_outlier_channels(x.data(), n, d, num_outliers);
  const std::vector<int32_t> order = se::outlier_channel_order(outliers, d);
  const se::TurboQuantSplit q(d, num_outliers, bits, seed);
  std::vector<uint8_t> codes(n * q.code_bytes());
  std::vector<uint16_t> norms(n * 2);
  std::vector<float> deq(n * d);
  for (int64_t i = 0; i < n; ++i) {
    q.encode(&x[i * d], order.data(), &codes[i * q.code_bytes()], &norms[i * 2]);
    q.decode(&codes[i * q.code_bytes()], &norms[i * 2], order.data(), &deq[i * d]);
  }
  write_array(prefix + "outliers", outliers);
  write_array(prefix + "rot_out", q.outlier_codec().rotation());
  write_array(prefix + "rot_reg", q.regular_codec().rotation());
  write_array(prefix + "codes", codes);
  write_array(prefix + "norm", norms);
  write_array(prefix + "deq", deq);
  return 0;
}

// The paper's store over one stream of n tokens.
int turboquant_prod_kv(int32_t bits, int64_t n, int32_t d, std::vector<float> k, std::vector<float> v,
                       const std::string& prefix) {
  se::TurboQuantChannelTable channels(1, 1, d);
  channels.calibrate(0, se::TensorView{k.data(), se::DType::kF32, se::Shape{n, 1, d}},
                     se::TensorView{v.data(), se::DType::kF32, se::Shape{n, 1, d}});
  const int32_t *key_order = channels.key_orders(0), *value_order = channels.value_orders(0);
  const se::TurboQuantProdKvCodec codec(d, bits);
  const size_t slot_bytes = codec.layout().slot_bytes();
  std::vector<uint8_t> slots(n * slot_bytes);
  std::vector<float> k_back(n * d), v_back(n * d);
  for (int64_t i = 0; i < n; ++i) {
    codec.encode(&k[i * d], &v[i * d], key_order, value_order, &slots[i * slot_bytes]);
    codec.decode(&slots[i * slot_bytes], key_order, value_order, &k_back[i * d], &v_back[i * d]);
  }
  write_array(prefix + "slots", slots);
  write_array(prefix + "k", k_back);
  write_array(prefix + "v", v_back);
  write_array(prefix + "korder", std::vector<int32_t>(key_order, key_order + d));
  write_array(prefix + "vorder", std::vector<int32_t>(value_order, value_order + d));
  write_array(prefix + "key_rot_out", codec.key_outlier_codec().mse().rotation());
  write_array(prefix + "key_rot_reg", codec.key_regular_codec().mse().rotation());
  write_array(prefix + "key_qjl_out", codec.key_outlier_codec().qjl().projection());
  write_array(prefix + "key_qjl_reg", codec.key_regular_codec().qjl().projection());
  write_array(prefix + "value_rot_out", codec.value_codec().outlier_codec().rotation());
  write_array(prefix + "value_rot_reg", codec.value_codec().regular_codec().rotation());
  return 0;
}

int turboquant_kv(char** argv) {
  const se::Result<se::KvStoreKind> store = se::parse_kv_cache_dtype(argv[2]);
  if (!store.is_ok() || !se::is_turboquant(*store)) {
    std::fprintf(stderr, "%s is not a TurboQuant store\n", argv[2]);
    return 2;
  }
  const int64_t n = std::stoll(argv[3]);
  const int32_t d = std::stoi(argv[4]);
  const std::vector<float> k = read_array<float>(argv[5]), v = read_array<float>(argv[6]);
  const std::string prefix = std::string(argv[7]) + ".";
  const se::TurboQuantKvFormat format = se::turboquant_format(*store);
  if (format.outlier_split) return turboquant_prod_kv(format.key_bits, n, d, k, v, prefix);
  const se::TurboQuantKvCodec codec(d, se::turboquant_format(*store));
  const size_t slot_bytes = codec.layout().slot_bytes();
  std::vector<uint8_t> slots(n * slot_bytes);
  std::vector<float> k_back(n * d), v_back(n * d);
  for (int64_t i = 0; i < n; ++i) {
    codec.encode(&k[i * d], &v[i * d], &slots[i * slot_bytes]);
    codec.decode(&slots[i * slot_bytes], &k_back[i * d], &v_back[i * d]);
  }
  write_array(prefix + "slots", slots);
  write_array(prefix + "k", k_back);
  write_array(prefix + "v", v_back);
  if (!codec.format().key_fp8())
    write_array(prefix + "rot", se::TurboQuantMse(d, codec.format().key_bits, se::kTurboQuantKvSeed).rotation());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "fp8" && argc == 6) {
    const std::vector<float> x = read_array<float>(argv[4]);
    std::vector<uint8_t> out(x.size());
    se::fp8_quantize(x.data(), x.size(), std::stof(argv[3]), fp8_format(argv[2]), out.data());
    write_array(argv[5], out);
    return 0;
  }
  if (cmd == "fp8_decode" && argc == 6) {
    const std::vector<uint8_t> codes = read_array<uint8_t>(argv[4]);
    std::vector<float> out(codes.size());
    se::fp8_dequantize(codes.data(), codes.size(), std::stof(argv[3]), fp8_format(argv[2]), out.data());
    write_array(argv[5], out);
    return 0;
  }
  if (cmd == "fp8_scales" && argc == 5) {
    const std::vector<float> k = read_array<float>(argv[2]), v = read_array<float>(argv[3]);
    const se::Fp8KvScales s = se::fp8_kv_scales_from_batch(k.data(), k.size(), v.data(), v.size());
    write_array(argv[4], std::vector<float>{s.k_scale[0], s.v_scale[0]});
    return 0;
  }
  if (cmd == "kivi" && argc == 9) return kivi(argc, argv);
  if (cmd == "kivi_stream" && argc >= 10) return kivi_stream(argc, argv);
  if (cmd == "kivi_evicted" && argc >= 11) return kivi_evicted(argc, argv);
  if (cmd == "turboquant" && argc == 9) return turboquant(argc, argv);
  if (cmd == "turboquant_split" && argc == 9) return turboquant_split(argc, argv);
  if (cmd == "turboquant_kv" && argc == 8) return turboquant_kv(argv);
  std::fprintf(stderr, "usage: see the header of quant_tool.cpp\n");
  return 2;
}
