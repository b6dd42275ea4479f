// The built-in trainer's datasets, from small files in each real format the test writes: MNIST's
// IDX pair, CIFAR-10's binary records, CSV; and synthetic data.
#include "joule/worker/datasets.hpp"

#include <gtest/gtest.h>

#include "temp_dir.hpp"

namespace joule::worker {
namespace {

using nlohmann::json;

std::string big_endian(std::uint32_t value) {
  return {static_cast<char>(value >> 24), static_cast<char>(value >> 16), static_cast<char>(value >> 8),
          static_cast<char>(value)};
}

// An IDX file of unsigned bytes: magic 0x000008NN, the dimensions, then the data.
std::string idx(const std::vector<std::uint32_t>& dims, const std::string& data) {
  std::string out = big_endian(0x0800u | static_cast<std::uint32_t>(dims.size()));
  for (const auto d : dims) out += big_endian(d);
  return out + data;
}

// CIFAR-10 records: a label byte, then 3×32×32 pixel bytes (here all `pixel`).
std::string cifar(const std::vector<int>& labels, unsigned char pixel = 51) {
  std::string out;
  for (const int label : labels) {
    out += static_cast<char>(label);
    out += std::string(3 * 32 * 32, static_cast<char>(pixel));
  }
  return out;
}

class DatasetsTest : public ::testing::Test {
 protected:
  Result<DatasetSpec> spec(const json& dataset) {
    return parse_dataset_spec(dataset, "/run/builtin/dataset", dir_.path());
  }

  joule::testing::TempDir dir_;
};

TEST_F(DatasetsTest, an_mnist_idx_pair_gives_images_in_zero_to_one_and_their_labels) {
  dir_.write("images", idx({3, 28, 28}, std::string(3 * 28 * 28, static_cast<char>(255))));
  dir_.write("labels", idx({3}, std::string{0, 7, 3}));
  auto parsed = spec({{"format", "mnist-idx"}, {"images", "images"}, {"labels", "labels"}});
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(parsed->files[0], dir_ / "images");  // relative to the job's directory
  auto info = inspect_dataset(*parsed);
  ASSERT_TRUE(info) << info.error().message;
  EXPECT_EQ(info->samples, 3);
  EXPECT_EQ(info->sample_shape, (std::vector<std::int64_t>{1, 28, 28}));
  EXPECT_EQ(info->classes, 8);
  EXPECT_TRUE(check_dataset_fits(*info, {1, 28, 28}, 10));
  auto loaded = load_dataset(*parsed, {1, 28, 28});
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->values.size(), 3u * 28 * 28);
  EXPECT_FLOAT_EQ(loaded->values.front(), 1.0f);
  EXPECT_EQ(loaded->labels, (std::vector<std::int64_t>{0, 7, 3}));
}

TEST_F(DatasetsTest, idx_files_of_the_wrong_kind_or_size_are_refused_naming_the_file) {
  dir_.write("images", idx({2, 4, 4}, std::string(2 * 16, 'x')));
  dir_.write("labels", idx({2}, std::string{1, 2}));
  dir_.write("short", idx({2, 4, 4}, std::string(20, 'x')));
  dir_.write("three", idx({3}, std::string{1, 2, 3}));
  dir_.write("gzipped", std::string("\x1f\x8b\x08\x00", 4) + std::string(40, 'x'));
  const auto error_of = [&](const char* images, const char* labels) {
    auto parsed = spec({{"format", "mnist-idx"}, {"images", images}, {"labels", labels}});
    EXPECT_TRUE(parsed);
    auto info = inspect_dataset(*parsed);
    EXPECT_FALSE(info);
    return info ? std::string() : info.error().message;
  };
  EXPECT_NE(error_of("labels", "images").find("labels: magic 0x00000801 has 1 dimension; images (idx3) have 3"),
            std::string::npos)
      << error_of("labels", "images");
  EXPECT_NE(
      error_of("short", "labels").find("short: the header promises 32 bytes of data (2 x 4 x 4), the file has 20"),
      std::string::npos)
      << error_of("short", "labels");
  EXPECT_NE(error_of("images", "three").find("holds 2 images but"), std::string::npos);
  EXPECT_NE(error_of("gzipped", "labels").find("gunzip them first"), std::string::npos);
  EXPECT_NE(error_of("missing", "labels").find("missing"), std::string::npos);
}

TEST_F(DatasetsTest, cifar10_batches_give_three_channel_images_and_refuse_bad_sizes_and_labels) {
  dir_.write("data_batch_1.bin", cifar({0, 9}));
  dir_.write("data_batch_2.bin", cifar({4}));
  auto parsed = spec({{"format", "cifar10"}, {"files", {"data_batch_1.bin", "data_batch_2.bin"}}});
  ASSERT_TRUE(parsed) << parsed.error().message;
  auto loaded = load_dataset(*parsed, {3, 32, 32});
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->info.samples, 3);
  EXPECT_EQ(loaded->info.sample_shape, (std::vector<std::int64_t>{3, 32, 32}));
  EXPECT_EQ(loaded->info.classes, 10);
  EXPECT_EQ(loaded->values.size(), 3u * 3072);
  EXPECT_FLOAT_EQ(loaded->values[5], 0.2f);
  EXPECT_EQ(loaded->labels, (std::vector<std::int64_t>{0, 9, 4}));

  dir_.write("cut.bin", cifar({1}).substr(0, 3000));
  auto cut = inspect_dataset(*spec({{"format", "cifar10"}, {"files", {"cut.bin"}}}));
  ASSERT_FALSE(cut);
  EXPECT_NE(cut.error().message.find("cut.bin: 3000 bytes is not a whole number of CIFAR-10 records"),
            std::string::npos)
      << cut.error().message;
  dir_.write("bad-label.bin", cifar({3, 12}));
  auto bad = inspect_dataset(*spec({{"format", "cifar10"}, {"files", {"bad-label.bin"}}}));
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("bad-label.bin: record 1 has label 12; CIFAR-10's labels are 0-9"),
            std::string::npos)
      << bad.error().message;
}

TEST_F(DatasetsTest, csv_rows_give_features_and_a_label_and_errors_give_file_and_line) {
  dir_.write("iris.csv", "sepal,petal,class\n5.1, 1.4, 0\n6.2,4.5,2\r\n\n5.9,5.1,1\n");
  auto parsed = spec({{"format", "csv"}, {"file", "iris.csv"}, {"header", true}});
  ASSERT_TRUE(parsed) << parsed.error().message;
  auto loaded = load_dataset(*parsed, {2});
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->info.samples, 3);
  EXPECT_EQ(loaded->info.sample_shape, (std::vector<std::int64_t>{2}));
  EXPECT_EQ(loaded->info.classes, 3);
  EXPECT_EQ(loaded->values, (std::vector<float>{5.1f, 1.4f, 6.2f, 4.5f, 5.9f, 5.1f}));
  EXPECT_EQ(loaded->labels, (std::vector<std::int64_t>{0, 2, 1}));
  // The label first.
  dir_.write("first.csv", "1,0.5,0.25\n0,1,2\n");
  auto first = load_dataset(*spec({{"format", "csv"}, {"file", "first.csv"}, {"label_column", 0}}), {2});
  ASSERT_TRUE(first) << first.error().message;
  EXPECT_EQ(first->labels, (std::vector<std::int64_t>{1, 0}));

  const auto error_of = [&](const std::string& text, bool header = false) {
    dir_.write("bad.csv", text);
    auto info = inspect_dataset(*spec({{"format", "csv"}, {"file", "bad.csv"}, {"header", header}}));
    return info ? std::string() : info.error().message;
  };
  EXPECT_NE(error_of("a,b,class\n1,2,0\n")
                .find("bad.csv:1: column 0: \"a\" is not a finite number (a header line? set "
                      "\"header\": true)"),
            std::string::npos)
      << error_of("a,b,class\n1,2,0\n");
  EXPECT_NE(error_of("1,2,0\n1,2\n").find("bad.csv:2: 2 columns where the first row has 3"), std::string::npos);
  EXPECT_NE(error_of("1,2,0\n1,2,cat\n").find("bad.csv:2: column 2 is the label and \"cat\" is not a class number"),
            std::string::npos);
  EXPECT_NE(error_of("1,2,-1\n").find("is not a class number"), std::string::npos);
  EXPECT_NE(error_of("h\n", true).find("bad.csv: no rows"), std::string::npos);
}

TEST_F(DatasetsTest, synthetic_data_has_the_models_shape_and_is_the_same_for_a_seed) {
  auto parsed = spec({{"format", "synthetic"}, {"samples", 50}, {"classes", 4}});
  ASSERT_TRUE(parsed) << parsed.error().message;
  auto a = load_dataset(*parsed, {3, 8}, 7);
  auto b = load_dataset(*parsed, {3, 8}, 7);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->values.size(), 50u * 24);
  EXPECT_EQ(a->values, b->values);
  EXPECT_EQ(a->labels, b->labels);
  for (const auto label : a->labels) EXPECT_LT(label, 4);
  EXPECT_EQ(a->info.classes, 4);
}

TEST_F(DatasetsTest, a_dataset_that_does_not_fit_the_model_says_how) {
  DatasetInfo info{100, {1, 28, 28}, 10};
  const auto shape = check_dataset_fits(info, {3, 32, 32}, 10);
  ASSERT_FALSE(shape);
  EXPECT_EQ(shape.error().message, "the dataset's samples are [1, 28, 28] but the model's input is [3, 32, 32]");
  const auto classes = check_dataset_fits(info, {1, 28, 28}, 5);
  ASSERT_FALSE(classes);
  EXPECT_EQ(classes.error().message, "the dataset has labels up to 9 (10 classes) but the model's output has 5");
}

// What the trainer trains on each epoch is what the estimate counts (samples_per_epoch).
TEST_F(DatasetsTest, the_split_trains_on_samples_per_epoch_for_synthetic_data_and_holds_out_a_share_of_files) {
  DatasetSpec synthetic;  // drawn to size: samples_per_epoch train, a tenth of that more held out
  EXPECT_EQ(split_dataset(synthetic, 0, 40).train, 40);
  EXPECT_EQ(split_dataset(synthetic, 0, 40).holdout, 4);
  DatasetSpec files;
  files.format = DatasetSpec::Format::csv;
  files.holdout = 0.25;
  EXPECT_EQ(split_dataset(files, 240, 0).train, 180);
  EXPECT_EQ(split_dataset(files, 240, 0).holdout, 60);
  files.holdout = 0.99;  // one sample at least trains
  EXPECT_EQ(split_dataset(files, 3, 0).train, 1);
}

TEST_F(DatasetsTest, a_model_that_cannot_train_on_files_is_told_why) {
  dir_.write("points.csv", "1,2,0\n3,4,1\n");
  auto parsed = spec({{"format", "csv"}, {"file", "points.csv"}});
  ASSERT_TRUE(parsed) << parsed.error().message;
  auto model = estimator::parse_model_spec(
      json{{"input", {{"shape", {2}}}}, {"layers", {{{"type", "linear"}, {"out_features", 2}}}}, {"loss", "mse"}},
      "/model");
  ASSERT_TRUE(model) << model.error().message;
  auto checked = check_dataset_for_model(*parsed, *model);
  ASSERT_FALSE(checked);
  EXPECT_EQ(checked.error().where, "/run/builtin/dataset/format");
  model->loss = "cross_entropy";
  checked = check_dataset_for_model(*parsed, *model);
  ASSERT_TRUE(checked) << checked.error().message;
  EXPECT_EQ(checked->samples, 2);
  model->layers[0].args["out_features"] = 1;  // labels 0 and 1 need two classes
  checked = check_dataset_for_model(*parsed, *model);
  ASSERT_FALSE(checked);
  EXPECT_NE(checked.error().message.find("the model's output has 1"), std::string::npos) << checked.error().message;
}

TEST_F(DatasetsTest, dataset_specs_name_the_field_that_is_wrong) {
  const auto where = [&](const json& dataset) {
    auto parsed = spec(dataset);
    return parsed ? std::string("(accepted)") : parsed.error().where + ": " + parsed.error().message;
  };
  EXPECT_EQ(where({{"format", "imagenet"}}).substr(0, 28), "/run/builtin/dataset/format:");
  EXPECT_EQ(where({{"format", "mnist-idx"}, {"images", "i"}}).substr(0, 28), "/run/builtin/dataset/labels:");
  EXPECT_EQ(where({{"format", "cifar10"}, {"files", json::array()}}).substr(0, 27), "/run/builtin/dataset/files:");
  EXPECT_EQ(where({{"format", "cifar10"}, {"files", {"a", 3}}}).substr(0, 29), "/run/builtin/dataset/files/1:");
  EXPECT_EQ(where({{"format", "csv"}, {"file", "x.csv"}, {"holdout", 1.0}}).substr(0, 29),
            "/run/builtin/dataset/holdout:");
  EXPECT_EQ(where({{"format", "csv"}, {"file", "x.csv"}, {"labels", 3}}).substr(0, 28), "/run/builtin/dataset/labels:");
  EXPECT_EQ(where({{"format", "synthetic"}, {"classes", 1}}).substr(0, 29), "/run/builtin/dataset/classes:");
  EXPECT_EQ(where({{"format", "synthetic"}}), "(accepted)");
}

}  // namespace
}  // namespace joule::worker
