// Net::SaveWeights / LoadWeights (common/tensor_file.h format): a save → load round trip
// restores every parameter bit for bit (and so the same outputs); a file with a wrong-shape,
// missing or unknown tensor, or no file at all, is one clear error naming the file and the
// tensor, and leaves the net's weights unchanged.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <random>
#include <vector>

#include "client/engine/net.h"
#include "common/tensor_file.h"
#include "downpour_config.h"

namespace downpour::engine {
namespace {

class EngineWeights : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("downpour_engine_weights_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    Status s = ParseNetSpecFile(DOWNPOUR_SOURCE_DIR "/configs/models/fmnist_small.toml", &spec_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Net> MakeNet(uint64_t seed) {
    NetOptions opt;
    opt.batch = 4;
    opt.worker.threads = 1;
    std::unique_ptr<Net> net;
    Status s = Net::Create(spec_, opt, &net);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (net) net->InitParams(seed);
    return net;
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // A file saved from `net`, then edited by `edit`, written to `name`.
  template <typename Edit>
  std::string EditedFile(Net& net, const std::string& name, Edit edit) {
    const std::string path = Path(name);
    EXPECT_TRUE(net.SaveWeights(path).ok());
    TensorFile file;
    EXPECT_TRUE(ReadTensorFile(path, &file).ok());
    edit(&file);
    EXPECT_TRUE(WriteTensorFile(path, file).ok());
    return path;
  }

  std::filesystem::path dir_;
  NetSpec spec_;
};

std::vector<float> Copy(std::span<float> s) { return {s.begin(), s.end()}; }

TEST_F(EngineWeights, SaveLoadRoundTripRestoresEveryParameterAndOutput) {
  auto a = MakeNet(11);
  auto b = MakeNet(22);
  ASSERT_NE(Copy(a->params()), Copy(b->params()));
  const std::string path = Path("w.dptf");
  Status s = a->SaveWeights(path);
  ASSERT_TRUE(s.ok()) << s.ToString();

  // The file holds param_specs() by name and canonical shape.
  TensorFile file;
  ASSERT_TRUE(ReadTensorFile(path, &file).ok());
  ASSERT_EQ(file.tensors.size(), a->param_specs().size());
  for (size_t i = 0; i < file.tensors.size(); ++i) {
    EXPECT_EQ(file.tensors[i].name, a->param_specs()[i].name);
    EXPECT_EQ(file.tensors[i].shape, a->param_specs()[i].shape);
  }
  EXPECT_EQ(file.meta.at("model"), spec_.name);

  s = b->LoadWeights(path);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Copy(a->params()), Copy(b->params()));

  std::mt19937 rng(3);
  std::normal_distribution<float> g;
  std::vector<float> images(a->input_count());
  for (float& v : images) v = g(rng);
  const std::vector<int> labels{0, 3, 7, 9};
  const EvalResult ra = a->Forward(images.data(), labels.data());
  const std::vector<float> scores_a = a->ReadScores();
  const EvalResult rb = b->Forward(images.data(), labels.data());
  EXPECT_EQ(ra.loss, rb.loss);
  EXPECT_EQ(scores_a, b->ReadScores());
}

TEST_F(EngineWeights, WrongShapeIsOneErrorNamingTheTensorAndWeightsStayUnchanged) {
  auto a = MakeNet(11);
  auto b = MakeNet(22);
  const std::string path = EditedFile(*a, "wrong_shape.dptf", [](TensorFile* f) {
    NamedTensor* t = nullptr;
    for (auto& x : f->tensors)
      if (x.name == "fc1.weight") t = &x;
    ASSERT_NE(t, nullptr);
    t->shape = {128, t->shape[1] * 2};  // same element count, wrong shape
  });
  const std::vector<float> before = Copy(b->params());
  const Status s = b->LoadWeights(path);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("fc1.weight"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("[128, 4608]"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("[256, 2304]"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_EQ(Copy(b->params()), before);
}

TEST_F(EngineWeights, MissingOrUnknownTensorIsAnErrorNamingItAndWeightsStayUnchanged) {
  auto a = MakeNet(11);
  auto b = MakeNet(22);
  const std::vector<float> before = Copy(b->params());

  const std::string missing = EditedFile(*a, "missing.dptf", [](TensorFile* f) {
    std::erase_if(f->tensors, [](const NamedTensor& t) { return t.name == "conv2.bias"; });
  });
  Status s = b->LoadWeights(missing);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("conv2.bias"), std::string::npos) << s.message();
  EXPECT_EQ(Copy(b->params()), before);

  const std::string renamed = EditedFile(*a, "renamed.dptf", [](TensorFile* f) {
    f->tensors.push_back(NamedTensor{"fc9.weight", {2, 2}, {1, 2, 3, 4}});
  });
  s = b->LoadWeights(renamed);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("fc9.weight"), std::string::npos) << s.message();
  EXPECT_EQ(Copy(b->params()), before);

  s = b->LoadWeights(Path("does_not_exist.dptf"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("does_not_exist.dptf"), std::string::npos) << s.message();
  EXPECT_EQ(Copy(b->params()), before);
}

}  // namespace
}  // namespace downpour::engine
