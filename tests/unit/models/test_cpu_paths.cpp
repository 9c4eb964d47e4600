// The CPU paths a bf16 model takes on a CPU without fast bf16 GEMMs (an AVX2 machine: ATen runs
// 16-bit matmuls there in a generic loop, 5-50x slower than float32): no ATen op that multiplies
// matrices may see a bf16 operand in a training step (forward and backward) of any registered
// model (their tiny flavors: the same layers as the debug ones), with the stock layers or titan's
// kernels (apply_compile), causal or block-causal, with and without grouped MoE GEMMs. Every such
// product runs in float32 on the rounded operands instead (widens_reduced_matmul). On a CPU with
// fast bf16 GEMMs the same step does run bf16 GEMMs (so the check sees them when they happen).
#include "titan/common/cpu.h"
#include "titan/config/job_config.h"
#include "titan/models/common/linear.h"
#include "titan/models/common/moe.h"
#include "titan/models/converters.h"
#include "titan/models/llama3/model.h"
#include "titan/models/registry.h"

#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <string>

namespace titan {
namespace test_cpu_paths {

// ATen ops that multiply matrices (the composite linear / matmul / einsum land in these).
const std::set<std::string>& gemm_ops() {
  static const std::set<std::string> ops = {
      "aten::mm",
      "aten::bmm",
      "aten::addmm",
      "aten::baddbmm",
      "aten::addbmm",
      "aten::_grouped_mm",
      "aten::mv",
      "aten::addmv",
      "aten::dot",
      "aten::_scaled_dot_product_flash_attention_for_cpu",
      "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
      "aten::_scaled_dot_product_attention_math",
  };
  return ops;
}

// Records the GEMM ops that receive a bf16 tensor while alive.
class Bf16GemmRecorder {
 public:
  Bf16GemmRecorder() {
    active() = this;
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(&Bf16GemmRecorder::on_start).needsInputs(true));
  }
  ~Bf16GemmRecorder() {
    at::removeCallback(handle_);
    active() = nullptr;
  }
  std::set<std::string> seen() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return seen_;
  }

 private:
  static Bf16GemmRecorder*& active() {
    static Bf16GemmRecorder* recorder = nullptr;
    return recorder;
  }
  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    Bf16GemmRecorder* r = active();
    if (r == nullptr || gemm_ops().count(fn.name()) == 0) return nullptr;
    for (const c10::IValue& input : fn.inputs()) {
      if (input.isTensor() && input.toTensor().defined() &&
          input.toTensor().scalar_type() == at::kBFloat16) {
        const std::lock_guard<std::mutex> lock(r->mutex_);
        r->seen_.insert(fn.name());
        break;
      }
    }
    return nullptr;
  }

  mutable std::mutex mutex_;
  std::set<std::string> seen_;
  at::CallbackHandle handle_ = 0;
};

// One bf16 training step of `model`/`flavor`: forward on 2 x 32 tokens, loss, backward.
void train_step(const std::string& model_name, const std::string& flavor, bool kernels,
                bool documents, bool grouped_mm) {
  ModelBuildOptions options;
  options.max_seq_len = 32;
  options.compute_dtype = at::kBFloat16;
  options.seed = 3;
  auto model = std::dynamic_pointer_cast<llama3::Transformer>(
      get_model_spec(model_name).build(flavor, options));
  ASSERT_NE(model, nullptr);
  for (const auto& m : model->modules()) {
    if (auto* moe = dynamic_cast<MoE*>(m.get())) moe->experts->use_grouped_mm = grouped_mm;
  }
  if (kernels) {
    CompileSection compile;
    apply_compile(*model, compile, at::kCPU, at::kBFloat16, 32);
  }
  at::manual_seed(11);
  const int64_t vocab = model->stats(1, 32).vocab_size;
  const at::Tensor tokens = at::randint(vocab, {2, 32}, at::kLong);
  const at::Tensor labels = at::randint(vocab, {2, 32}, at::kLong);
  ForwardInputs inputs;
  if (documents) inputs.document_ids = tokens.remainder(5).eq(0).cumsum(1);
  const at::Tensor logits = model->forward(tokens, inputs);
  at::cross_entropy_loss(logits.flatten(0, 1).to(at::kFloat), labels.flatten(0, 1)).backward();
}

struct Case {
  std::string model, flavor;
};
const Case kCases[] = {
    {"llama3", "tiny"}, {"qwen3", "tiny"}, {"qwen3", "tiny_moe"}, {"deepseek_v3", "tiny"}};

TEST(CpuPaths, NoBf16GemmWithoutFastBf16Gemms) {
  override_fast_bf16_matmul_for_testing(false);
  for (const Case& c : kCases) {
    // Stock layers with causal attention, titan's kernels with block-causal attention, and for
    // the MoE the experts' loop besides their grouped GEMMs.
    for (int variant = 0; variant < (c.flavor == "tiny_moe" ? 3 : 2); ++variant) {
      const bool kernels = variant == 1, documents = variant == 1, grouped = variant != 2;
      const std::string what = c.model + " " + c.flavor + (kernels ? ", titan's kernels" : "") +
                               (documents ? ", block-causal" : "") + (grouped ? "" : ", MoE loop");
      const Bf16GemmRecorder recorder;
      train_step(c.model, c.flavor, kernels, documents, grouped);
      for (const std::string& op : recorder.seen()) ADD_FAILURE() << what << ": bf16 " << op;
    }
  }
  override_fast_bf16_matmul_for_testing(std::nullopt);
}

TEST(CpuPaths, FastBf16GemmsStayInBf16) {
  override_fast_bf16_matmul_for_testing(true);
  const Bf16GemmRecorder recorder;
  train_step("qwen3", "tiny_moe", /*kernels=*/false, /*documents=*/false, /*grouped=*/true);
  const std::set<std::string> seen = recorder.seen();
  override_fast_bf16_matmul_for_testing(std::nullopt);
  // The check sees bf16 products where they happen: the linears, attention and the experts.
  EXPECT_TRUE(seen.count("aten::mm") || seen.count("aten::addmm")) << seen.size();
  EXPECT_TRUE(seen.count("aten::_grouped_mm"));
  EXPECT_TRUE(seen.count("aten::_scaled_dot_product_flash_attention_for_cpu"));
}

// Float32 values whose rounding to bf16 is a corner: ties to even both ways, the largest finite
// float (rounds to infinity), infinities, NaN, signed zero, subnormals; then random values of
// every magnitude.
at::Tensor corner_and_random_floats(int64_t n) {
  const uint32_t corners[] = {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0x7f7fffffu,
                              0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                              0x80000000u, 0x00000000u, 0x00000001u, 0x00008000u, 0x807fffffu};
  at::Tensor out = at::randn({n}, at::kFloat) * at::pow(10.0, at::randint(-40, 38, {n}));
  uint32_t* bits = reinterpret_cast<uint32_t*>(out.data_ptr<float>());
  for (size_t i = 0; i < std::size(corners); ++i) bits[i * 7] = corners[i];
  return out;
}

// The same tensor bit for bit, NaN for NaN (ATen's own casts give NaN more than one bit pattern:
// 0xffff from its vector loop, 0x7fc0 from its scalar tail).
void expect_same_bits(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  ASSERT_EQ(a.scalar_type(), at::kFloat) << what;
  ASSERT_EQ(b.scalar_type(), at::kFloat) << what;
  EXPECT_TRUE(at::equal(a.isnan(), b.isnan())) << what;
  const at::Tensor numbers = a.isnan().logical_not();
  EXPECT_TRUE(
      at::equal(a.masked_select(numbers).view(at::kInt), b.masked_select(numbers).view(at::kInt)))
      << what;
}

// widened_weight computes and differentiates as the two casts it replaces, in one pass: the
// values and the gradient bit for bit, for a weight of odd sizes, a transposed one, corners of
// the rounding and random values.
TEST(CpuPaths, WidenedWeightIsTheTwoCasts) {
  at::manual_seed(5);
  const at::Tensor base = corner_and_random_floats(37 * 129).view({37, 129});
  const at::Tensor grad = corner_and_random_floats(37 * 129).view({37, 129});
  for (const bool transposed : {false, true}) {
    const std::string what = transposed ? "transposed" : "contiguous";
    const at::Tensor w = (transposed ? base.t().contiguous().t() : base).detach().requires_grad_();
    const at::Tensor ref_w = w.detach().clone().requires_grad_();
    const at::Tensor out = widened_weight(w, at::kBFloat16);
    const at::Tensor ref = ref_w.to(at::kBFloat16).to(at::kFloat);
    expect_same_bits(out, ref, what + " forward");
    out.backward(grad);
    ref.backward(grad);
    expect_same_bits(w.grad(), ref_w.grad(), what + " gradient");
  }
  // Other dtypes take the two casts: fp16 compute, and a weight already in bf16.
  const at::Tensor w = base.narrow(0, 0, 4);
  expect_same_bits(widened_weight(w, at::kHalf), w.to(at::kHalf).to(at::kFloat), "fp16");
  const at::Tensor w16 = w.to(at::kBFloat16);
  expect_same_bits(widened_weight(w16, at::kBFloat16), w16.to(at::kFloat), "bf16 weight");
}

}  // namespace test_cpu_paths
}  // namespace titan
