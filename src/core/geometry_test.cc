#include "kvferry/geometry.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace kvferry {
namespace {

std::string read_models_file() {
  std::ifstream in(std::string(KVFERRY_SOURCE_DIR) + "/data/models.json");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<ModelGeometry> models() {
  auto m = parse_models_json(read_models_file());
  EXPECT_TRUE(m.ok()) << m.status().str();
  return m.ok() ? *m : std::vector<ModelGeometry>{};
}

TEST(Geometry, VendoredFileParses) {
  auto ms = models();
  ASSERT_EQ(ms.size(), 6u);
  auto llama = find_model(ms, "Llama-3.1-8B");
  ASSERT_TRUE(llama.ok());
  EXPECT_EQ(llama->attention, "GQA");
  EXPECT_EQ(llama->num_layers, 32u);
  EXPECT_EQ(llama->tensors_per_layer, 2u);
  EXPECT_EQ(llama->cache_heads, 8u);
  EXPECT_EQ(llama->head_dim, 128u);
  EXPECT_EQ(llama->dtype_bytes, 2u);
  EXPECT_EQ(llama->kv_bytes_per_token(), 131072u);
  auto ds = find_model(ms, "DeepSeek-V3");
  ASSERT_TRUE(ds.ok());
  EXPECT_TRUE(ds->is_mla());
  EXPECT_EQ(ds->tensors_per_layer, 1u);
  EXPECT_EQ(ds->cache_heads, 1u);
  EXPECT_EQ(ds->head_dim, 576u);
  EXPECT_EQ(ds->kv_bytes_per_token(), 70272u);
}

TEST(Geometry, EveryModelMatchesTheFilesOwnTotal) {
  auto doc = nlohmann::json::parse(read_models_file());
  auto ms = models();
  ASSERT_EQ(ms.size(), doc.size());
  for (size_t i = 0; i < ms.size(); ++i) {
    EXPECT_EQ(ms[i].name, doc[i]["model"].get<std::string>());
    EXPECT_EQ(ms[i].kv_bytes_per_token(), doc[i]["kv_bytes_per_token"].get<uint64_t>()) << ms[i].name;
  }
}

TEST(Geometry, UnknownModelListsKnownNames) {
  auto r = find_model(models(), "GPT-5");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  for (const char* n : {"GPT-5", "Llama-3.1-8B", "Llama-3.1-70B", "Qwen2.5-7B", "Qwen3-8B", "Mistral-7B-v0.1",
                        "DeepSeek-V3"}) {
    EXPECT_NE(r.status().message().find(n), std::string::npos) << n;
  }
}

TEST(Geometry, ParseErrors) {
  auto bad_json = parse_models_json("[{");
  ASSERT_FALSE(bad_json.ok());
  EXPECT_EQ(bad_json.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(parse_models_json("{}").ok());
  const std::string good =
      R"({"model":"M","attention":"GQA","num_hidden_layers":2,"cache_tensors_per_layer":2,)"
      R"("cache_heads_per_layer":4,"cache_entry_dim":64,"dtype_bytes":2)";
  auto ok = parse_models_json("[" + good + "}]");
  ASSERT_TRUE(ok.ok()) << ok.status().str();
  EXPECT_EQ((*ok)[0].kv_bytes_per_token(), 2u * 2 * 4 * 64 * 2);
  auto wrong_total = parse_models_json("[" + good + R"(,"kv_bytes_per_token":1})" + "]");
  ASSERT_FALSE(wrong_total.ok());
  EXPECT_NE(wrong_total.status().message().find("kv_bytes_per_token"), std::string::npos);
  auto missing = parse_models_json(R"([{"model":"M","attention":"GQA"}])");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("missing field 'num_hidden_layers'"), std::string::npos);
  auto str_field = parse_models_json(
      R"([{"model":"M","attention":"GQA","num_hidden_layers":"32","cache_tensors_per_layer":2,)"
      R"("cache_heads_per_layer":4,"cache_entry_dim":64,"dtype_bytes":2}])");
  ASSERT_FALSE(str_field.ok());
  EXPECT_NE(str_field.status().message().find("must be an integer"), std::string::npos);
  auto bad_att = parse_models_json(
      R"([{"model":"M","attention":"XYZ","num_hidden_layers":2,"cache_tensors_per_layer":2,)"
      R"("cache_heads_per_layer":4,"cache_entry_dim":64,"dtype_bytes":2}])");
  EXPECT_FALSE(bad_att.ok());
  EXPECT_FALSE(parse_models_json("[" + good + "}," + good + "}]").ok());  // duplicate name
}

TEST(Layout, GqaSplitsHeadsEvenly) {
  auto m = *find_model(models(), "Llama-3.1-8B");  // 8 KV heads
  struct Case {
    uint32_t tp, heads_per_rank;
  };
  for (Case c : {Case{1, 8}, Case{2, 4}, Case{4, 2}, Case{8, 1}}) {
    for (uint32_t r = 0; r < c.tp; ++r) {
      auto l = make_layout(m, c.tp, r, 16, 64ull << 20, 8);
      ASSERT_TRUE(l.ok()) << l.status().str();
      EXPECT_EQ(l->heads_per_rank, c.heads_per_rank);
      EXPECT_EQ(l->first_head, r * c.heads_per_rank);
      EXPECT_EQ(l->token_bytes(), c.heads_per_rank * 128u * 2u);
    }
  }
}

TEST(Layout, GqaReplicatesHeadsWhenTpExceedsHeads) {
  auto m = *find_model(models(), "Llama-3.1-8B");
  for (uint32_t r = 0; r < 16; ++r) {
    auto l = make_layout(m, 16, r, 16, 64ull << 20, 8);
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(l->heads_per_rank, 1u);
    EXPECT_EQ(l->first_head, r / 2);  // ranks 2k and 2k+1 hold head k
  }
  auto q = *find_model(models(), "Qwen2.5-7B");  // 4 KV heads
  EXPECT_EQ(make_layout(q, 8, 5, 16, 64ull << 20, 8)->first_head, 2u);
  for (uint32_t bad_tp : {3u, 6u}) {
    auto l = make_layout(q, bad_tp, 0, 16, 64ull << 20, 8);
    ASSERT_FALSE(l.ok());
    EXPECT_EQ(l.status().code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_FALSE(make_layout(q, 4, 4, 16, 64ull << 20, 8).ok());  // rank outside tp_size
}

TEST(Layout, MlaEveryRankHoldsTheLatent) {
  auto m = *find_model(models(), "DeepSeek-V3");
  for (uint32_t tp : {1u, 8u, 16u}) {
    auto l = make_layout(m, tp, tp - 1, 64, 1ull << 30, 4);
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(l->heads_per_rank, 1u);
    EXPECT_EQ(l->first_head, 0u);
    EXPECT_EQ(l->num_buffers(), 61u);
    EXPECT_EQ(l->token_bytes(), 1152u);
  }
}

TEST(Layout, PagesAndOffsets) {
  auto m = *find_model(models(), "Llama-3.1-8B");
  // tp 2: 4 heads x 128 x 2 = 1 KiB per token; page 16 tokens = 16 KiB; 64 buffers.
  const uint64_t stripe = 64ull * 16 * 1024;
  const uint64_t pool = 10 * stripe + 8 * kAuxSlotBytes + 123;
  auto l = make_layout(m, 2, 1, 16, pool, 8);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->num_pages, 10u);
  EXPECT_EQ(l->page_bytes(), 16384u);
  EXPECT_EQ(l->buffer_bytes(), 163840u);
  EXPECT_EQ(l->page_offset(3, 2), 3 * 163840u + 2 * 16384u);
  EXPECT_EQ(l->aux_offset(0), 64 * 163840u);
  EXPECT_EQ(l->total_bytes(), 64 * 163840u + 8 * kAuxSlotBytes);
  EXPECT_LE(l->total_bytes(), pool);
  EXPECT_EQ(l->pages_for(33), 3u);
  EXPECT_EQ(l->bytes_for_pages(3), 3 * 16384u * 64);
  auto tiny = make_layout(m, 2, 1, 16, stripe - 1 + 8 * kAuxSlotBytes, 8);
  ASSERT_FALSE(tiny.ok());
  EXPECT_EQ(tiny.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(make_layout(m, 2, 1, 0, pool, 8).ok());  // page_size 0
}

}  // namespace
}  // namespace kvferry

namespace kvferry {
namespace {
TEST(LoadModelFile, ReadsTheVendoredFileAndNamesWhatIsWrong) {
  const std::string file = KVFERRY_SOURCE_DIR "/data/models.json";
  auto m = load_model_file(file, "Llama-3.1-8B");
  ASSERT_TRUE(m.ok()) << m.status().str();
  EXPECT_EQ(m->num_layers, 32u);
  auto unknown = load_model_file(file, "NoSuchModel");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("Llama-3.1-8B"), std::string::npos);  // lists known names
  auto missing = load_model_file("/nonexistent/models.json", "Llama-3.1-8B");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("/nonexistent/models.json"), std::string::npos);
}

TEST(LayerRange, ResolvesTheDefaultAndRefusesEmptyOrPastTheModel) {
  auto all = resolve_layers({}, 32);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->begin, 0u);
  EXPECT_EQ(all->end, 32u);
  auto one = resolve_layers({31, 32}, 32);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, (LayerRange{31, 32}));
  auto empty = resolve_layers({4, 4}, 32);
  EXPECT_EQ(empty.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("[4, 4) is empty"), std::string::npos) << empty.status().message();
  auto past = resolve_layers({30, 33}, 32);
  EXPECT_EQ(past.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(past.status().message().find("past the model's 32 layers"), std::string::npos);
  EXPECT_FALSE(resolve_layers({32, LayerRange::kToLastLayer}, 32).ok());
}
}  // namespace
}  // namespace kvferry
