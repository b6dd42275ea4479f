#include "joule/worker/datasets.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "joule/estimator/layer_analysis.hpp"

namespace joule::worker {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

Error invalid(std::string message, std::string where = {}) {
  return make_error(ErrorCode::invalid_argument, std::move(message), std::move(where));
}

// A file's name as messages give it: the path as the job wrote it, resolved.
std::string named(const fs::path& file) { return file.string(); }

Result<std::vector<unsigned char>> read_bytes(const fs::path& file, std::size_t limit = std::size_t{1} << 32) {
  std::error_code error;
  const auto size = fs::file_size(file, error);
  if (error) return invalid(fmt::format("{}: {}", named(file), error.message()));
  if (size > limit)
    return invalid(fmt::format("{}: {} bytes, more than the {} a dataset file may have", named(file), size, limit));
  std::ifstream in(file, std::ios::binary);
  if (!in) return invalid(fmt::format("{}: cannot be opened", named(file)));
  std::vector<unsigned char> bytes(size);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  if (!in) return invalid(fmt::format("{}: could not be read whole", named(file)));
  return bytes;
}

// The first `count` bytes of a file and its size: enough to check a header against the size.
Result<std::pair<std::vector<unsigned char>, std::uintmax_t>> read_head(const fs::path& file, std::size_t count) {
  std::error_code error;
  const auto size = fs::file_size(file, error);
  if (error) return invalid(fmt::format("{}: {}", named(file), error.message()));
  std::ifstream in(file, std::ios::binary);
  if (!in) return invalid(fmt::format("{}: cannot be opened", named(file)));
  std::vector<unsigned char> bytes(static_cast<std::size_t>(std::min<std::uintmax_t>(size, count)));
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!in) return invalid(fmt::format("{}: could not be read", named(file)));
  return std::pair{std::move(bytes), size};
}

std::uint32_t big_endian(const unsigned char* at) {
  return (std::uint32_t{at[0]} << 24) | (std::uint32_t{at[1]} << 16) | (std::uint32_t{at[2]} << 8) | at[3];
}

// An IDX file: its dimensions, and the offset of its unsigned bytes.
struct Idx {
  std::vector<std::int64_t> dims;
  std::size_t offset = 0;
};

// `bytes` holds at least the header; `size` is the whole file's.
Result<Idx> parse_idx(const std::vector<unsigned char>& bytes, std::uintmax_t size, const fs::path& file,
                      int want_dims) {
  const char* what = want_dims == 1 ? "labels (idx1)" : "images (idx3)";
  if (bytes.size() < 4)
    return invalid(fmt::format("{}: {} bytes, too short for an IDX header", named(file), bytes.size()));
  const std::uint32_t magic = big_endian(bytes.data());
  if (bytes[0] != 0 || bytes[1] != 0 || bytes[2] != 0x08)
    return invalid(
        fmt::format("{}: magic 0x{:08x} is not an IDX file of unsigned bytes (0x000008NN); MNIST's files "
                    "are the uncompressed ones (gunzip them first)",
                    named(file), magic));
  const int dims = bytes[3];
  if (dims != want_dims)
    return invalid(fmt::format("{}: magic 0x{:08x} has {} dimension{}; {} have {}", named(file), magic, dims,
                               dims == 1 ? "" : "s", what, want_dims));
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(dims);
  if (bytes.size() < header) return invalid(fmt::format("{}: the IDX header is cut short", named(file)));
  Idx idx;
  idx.offset = header;
  std::size_t expected = 1;
  for (int d = 0; d < dims; ++d) {
    const auto size = big_endian(bytes.data() + 4 + 4 * d);
    if (size == 0) return invalid(fmt::format("{}: dimension {} is 0", named(file), d));
    idx.dims.push_back(size);
    expected *= size;
  }
  if (size != header + expected)
    return invalid(fmt::format("{}: the header promises {} bytes of data ({}), the file has {}", named(file), expected,
                               fmt::join(idx.dims, " x "), size - header));
  return idx;
}

constexpr std::size_t kCifarRecord = 1 + 3 * 32 * 32;

// A CSV file's rows as numbers; `label_column` is the label's.
struct Csv {
  std::vector<float> values;
  std::vector<std::int64_t> labels;
  std::size_t features = 0;
};

Result<Csv> parse_csv(const DatasetSpec& spec) {
  const fs::path& file = spec.files.front();
  std::ifstream in(file);
  if (!in) return invalid(fmt::format("{}: cannot be opened", named(file)));
  Csv csv;
  std::string line;
  std::size_t line_number = 0;
  std::size_t columns = 0;
  std::size_t label = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (line_number == 1 && spec.header) continue;
    std::vector<std::string_view> fields;
    std::string_view rest(line);
    while (true) {
      const auto comma = rest.find(',');
      fields.push_back(rest.substr(0, comma));
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    if (columns == 0) {
      columns = fields.size();
      if (columns < 2)
        return invalid(fmt::format("{}:{}: {} column; a row needs at least one feature and a label", named(file),
                                   line_number, columns));
      label = spec.label_column.value_or(columns - 1);
      if (label >= columns)
        return invalid(
            fmt::format("{}:{}: label_column {} but rows have {} columns", named(file), line_number, label, columns));
      csv.features = columns - 1;
    } else if (fields.size() != columns) {
      return invalid(fmt::format("{}:{}: {} columns where the first row has {}", named(file), line_number,
                                 fields.size(), columns));
    }
    for (std::size_t c = 0; c < fields.size(); ++c) {
      std::string_view field = fields[c];
      while (!field.empty() && field.front() == ' ') field.remove_prefix(1);
      while (!field.empty() && field.back() == ' ') field.remove_suffix(1);
      if (c == label) {
        std::int64_t value = -1;
        const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), value);
        if (error != std::errc() || end != field.data() + field.size() || value < 0)
          return invalid(fmt::format("{}:{}: column {} is the label and \"{}\" is not a class number (0, 1, 2...)",
                                     named(file), line_number, c, field));
        csv.labels.push_back(value);
      } else {
        // from_chars for floating point is in g++ 11+: no locale, no allocation.
        float value = 0.0f;
        const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), value);
        if (error != std::errc() || end != field.data() + field.size() || !std::isfinite(value))
          return invalid(fmt::format("{}:{}: column {}: \"{}\" is not a finite number{}", named(file), line_number, c,
                                     field,
                                     line_number == 1 && !spec.header ? " (a header line? set \"header\": true)" : ""));
        csv.values.push_back(value);
      }
    }
  }
  if (csv.labels.empty()) return invalid(fmt::format("{}: no rows", named(file)));
  return csv;
}

std::int64_t classes_of(const std::vector<std::int64_t>& labels) {
  std::int64_t largest = -1;
  for (const auto label : labels) largest = std::max(largest, label);
  return largest + 1;
}

// Every label always (the classes and their range need them); the values only when kept, so
// that checking a job's dataset at submit reads headers and labels, not the pixels.
Result<Dataset> read_dataset(const DatasetSpec& spec, const std::vector<std::int64_t>& input_shape, std::uint64_t seed,
                             bool keep_values) {
  Dataset out;
  switch (spec.format) {
    case DatasetSpec::Format::synthetic: {
      out.info.samples = spec.samples;
      out.info.sample_shape = input_shape;
      out.info.classes = spec.classes;
      if (input_shape.empty() || !keep_values) return out;  // inspected only: nothing to draw
      std::int64_t per_sample = 1;
      for (const auto d : input_shape) per_sample *= d;
      std::mt19937_64 random(seed);
      std::normal_distribution<float> value(0.0f, 1.0f);
      std::uniform_int_distribution<std::int64_t> label(0, spec.classes - 1);
      out.values.resize(static_cast<std::size_t>(per_sample * spec.samples));
      for (auto& v : out.values) v = value(random);
      out.labels.resize(static_cast<std::size_t>(spec.samples));
      for (auto& l : out.labels) l = label(random);
      return out;
    }
    case DatasetSpec::Format::mnist_idx: {
      auto images =
          keep_values ? read_bytes(spec.files[0]) : Result<std::vector<unsigned char>>(std::vector<unsigned char>{});
      if (!images) return images.error();
      auto image_head = read_head(spec.files[0], 16);
      if (!image_head) return image_head.error();
      auto labels = read_bytes(spec.files[1]);
      if (!labels) return labels.error();
      auto image_idx = parse_idx(image_head->first, image_head->second, spec.files[0], 3);
      if (!image_idx) return image_idx.error();
      auto label_idx = parse_idx(*labels, labels->size(), spec.files[1], 1);
      if (!label_idx) return label_idx.error();
      if (image_idx->dims[0] != label_idx->dims[0])
        return invalid(fmt::format("{} holds {} images but {} holds {} labels", named(spec.files[0]),
                                   image_idx->dims[0], named(spec.files[1]), label_idx->dims[0]));
      out.info.samples = image_idx->dims[0];
      out.info.sample_shape = {1, image_idx->dims[1], image_idx->dims[2]};
      out.labels.assign(labels->begin() + static_cast<std::ptrdiff_t>(label_idx->offset), labels->end());
      if (keep_values) {
        out.values.reserve(images->size() - image_idx->offset);
        for (auto it = images->begin() + static_cast<std::ptrdiff_t>(image_idx->offset); it != images->end(); ++it)
          out.values.push_back(static_cast<float>(*it) / 255.0f);
      }
      break;
    }
    case DatasetSpec::Format::cifar10: {
      for (const auto& file : spec.files) {
        auto bytes = read_bytes(file);
        if (!bytes) return bytes.error();
        if (bytes->empty() || bytes->size() % kCifarRecord != 0)
          return invalid(
              fmt::format("{}: {} bytes is not a whole number of CIFAR-10 records ({} bytes: a label and "
                          "3x32x32 pixels); CIFAR-100's binary format has two label bytes",
                          named(file), bytes->size(), kCifarRecord));
        for (std::size_t at = 0; at < bytes->size(); at += kCifarRecord) {
          const int label = (*bytes)[at];
          if (label > 9)
            return invalid(fmt::format("{}: record {} has label {}; CIFAR-10's labels are 0-9", named(file),
                                       at / kCifarRecord, label));
          out.labels.push_back(label);
          if (keep_values)
            for (std::size_t i = 1; i < kCifarRecord; ++i)
              out.values.push_back(static_cast<float>((*bytes)[at + i]) / 255.0f);
        }
      }
      out.info.samples = static_cast<std::int64_t>(out.labels.size());
      out.info.sample_shape = {3, 32, 32};
      break;
    }
    case DatasetSpec::Format::csv: {
      auto csv = parse_csv(spec);
      if (!csv) return csv.error();
      out.info.samples = static_cast<std::int64_t>(csv->labels.size());
      out.info.sample_shape = {static_cast<std::int64_t>(csv->features)};
      if (keep_values) out.values = std::move(csv->values);
      out.labels = std::move(csv->labels);
      break;
    }
  }
  out.info.classes = classes_of(out.labels);
  return out;
}

}  // namespace

Result<DatasetSpec> parse_dataset_spec(const json& in, const std::string& pointer, const fs::path& base) {
  if (!in.is_object()) return invalid("dataset must be an object with a \"format\"", pointer);
  const auto format = in.find("format");
  if (format == in.end() || !format->is_string())
    return invalid("dataset format is required: \"mnist-idx\", \"cifar10\", \"csv\" or \"synthetic\"",
                   pointer + "/format");
  DatasetSpec spec;
  std::vector<std::string> allowed = {"format", "holdout"};
  const auto path_at = [&](const json& value, const std::string& where) -> Result<fs::path> {
    if (!value.is_string() || value.get<std::string>().empty()) return invalid("a file path (a string)", where);
    fs::path path = value.get<std::string>();
    return path.is_absolute() || base.empty() ? path : base / path;
  };
  const std::string name = format->get<std::string>();
  if (name == "mnist-idx") {
    spec.format = DatasetSpec::Format::mnist_idx;
    allowed.insert(allowed.end(), {"images", "labels"});
    for (const char* key : {"images", "labels"}) {
      if (!in.contains(key))
        return invalid(fmt::format("mnist-idx needs \"{}\" (the {}-ubyte file)", key,
                                   key == std::string("images") ? "images-idx3" : "labels-idx1"),
                       pointer + "/" + key);
      auto path = path_at(in[key], pointer + "/" + key);
      if (!path) return path.error();
      spec.files.push_back(*path);
    }
  } else if (name == "cifar10") {
    spec.format = DatasetSpec::Format::cifar10;
    allowed.push_back("files");
    const auto files = in.find("files");
    if (files == in.end() || !files->is_array() || files->empty())
      return invalid("cifar10 needs \"files\": the binary batches (data_batch_1.bin ...)", pointer + "/files");
    for (std::size_t i = 0; i < files->size(); ++i) {
      auto path = path_at((*files)[i], fmt::format("{}/files/{}", pointer, i));
      if (!path) return path.error();
      spec.files.push_back(*path);
    }
  } else if (name == "csv") {
    spec.format = DatasetSpec::Format::csv;
    allowed.insert(allowed.end(), {"file", "label_column", "header"});
    if (!in.contains("file")) return invalid("csv needs \"file\"", pointer + "/file");
    auto path = path_at(in["file"], pointer + "/file");
    if (!path) return path.error();
    spec.files.push_back(*path);
    if (const auto it = in.find("label_column"); it != in.end()) {
      if (!it->is_number_integer() || it->get<std::int64_t>() < 0)
        return invalid("label_column is a column number from 0", pointer + "/label_column");
      spec.label_column = it->get<std::size_t>();
    }
    if (const auto it = in.find("header"); it != in.end()) {
      if (!it->is_boolean()) return invalid("header is true or false", pointer + "/header");
      spec.header = it->get<bool>();
    }
  } else if (name == "synthetic") {
    spec.format = DatasetSpec::Format::synthetic;
    allowed.insert(allowed.end(), {"samples", "classes"});
    if (const auto it = in.find("samples"); it != in.end()) {
      if (!it->is_number_integer() || it->get<std::int64_t>() < 1 || it->get<std::int64_t>() > (std::int64_t{1} << 24))
        return invalid("samples is a number of samples from 1 to 16777216", pointer + "/samples");
      spec.samples = it->get<std::int64_t>();
    }
    if (const auto it = in.find("classes"); it != in.end()) {
      if (!it->is_number_integer() || it->get<std::int64_t>() < 2 || it->get<std::int64_t>() > 100000)
        return invalid("classes is a number of classes from 2 to 100000", pointer + "/classes");
      spec.classes = it->get<std::int64_t>();
    }
  } else {
    return invalid(
        fmt::format("unknown dataset format \"{}\": \"mnist-idx\", \"cifar10\", \"csv\" or \"synthetic\"", name),
        pointer + "/format");
  }
  if (const auto it = in.find("holdout"); it != in.end()) {
    if (!it->is_number() || !(it->get<double>() >= 0.0 && it->get<double>() < 1.0))
      return invalid("holdout is the share of samples kept out of training, from 0 up to (not including) 1",
                     pointer + "/holdout");
    spec.holdout = it->get<double>();
  }
  for (const auto& [key, value] : in.items())
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      return invalid(fmt::format("unknown field \"{}\" for a {} dataset", key, name), pointer + "/" + key);
  return spec;
}

Result<DatasetInfo> inspect_dataset(const DatasetSpec& spec) {
  auto read = read_dataset(spec, {}, 1, /*keep_values=*/false);
  if (!read) return read.error();
  return read->info;
}

Result<Dataset> load_dataset(const DatasetSpec& spec, const std::vector<std::int64_t>& input_shape,
                             std::uint64_t seed) {
  return read_dataset(spec, input_shape, seed, /*keep_values=*/true);
}

Status check_dataset_fits(const DatasetInfo& info, const std::vector<std::int64_t>& input_shape,
                          std::int64_t model_classes) {
  if (!info.sample_shape.empty() && info.sample_shape != input_shape)
    return invalid(fmt::format("the dataset's samples are [{}] but the model's input is [{}]",
                               fmt::join(info.sample_shape, ", "), fmt::join(input_shape, ", ")));
  if (model_classes > 0 && info.classes > model_classes)
    return invalid(fmt::format("the dataset has labels up to {} ({} classes) but the model's output has {}",
                               info.classes - 1, info.classes, model_classes));
  return {};
}

DatasetSplit split_dataset(const DatasetSpec& spec, std::int64_t samples, std::int64_t samples_per_epoch) {
  if (spec.format == DatasetSpec::Format::synthetic && spec.samples == 0) {
    const std::int64_t train = std::max<std::int64_t>(samples_per_epoch, 1);
    return {train, static_cast<std::int64_t>(std::floor(spec.holdout * static_cast<double>(train)))};
  }
  const auto holdout = std::min<std::int64_t>(
      static_cast<std::int64_t>(std::floor(spec.holdout * static_cast<double>(samples))), samples - 1);
  return {samples - holdout, holdout};
}

Result<DatasetInfo> check_dataset_for_model(const DatasetSpec& spec, const estimator::ModelSpec& model) {
  const std::string pointer = "/run/builtin/dataset";
  const bool classifies = model.loss != "mse";
  if (spec.format != DatasetSpec::Format::synthetic) {
    if (model.input_dtype == "token")
      return invalid(
          "a model whose input is token ids trains on synthetic data only (the file formats hold pixels or numbers)",
          pointer + "/format");
    if (!classifies)
      return invalid(
          "a model trained with the mse loss trains on synthetic data only (the file formats hold class labels)",
          pointer + "/format");
  }
  auto layers = estimator::analyze_model(model, 1, "/model");
  if (!layers) return layers.error();
  const std::int64_t classes = classifies && !layers->empty() ? layers->back().output_shape.back() : 0;
  if (spec.format == DatasetSpec::Format::synthetic) {
    DatasetInfo info;
    info.samples = spec.samples;
    info.sample_shape = model.input_shape;
    info.classes = classes;
    return info;
  }
  auto info = inspect_dataset(spec);
  if (!info) return info.error();
  if (auto fits = check_dataset_fits(*info, model.input_shape, classes); !fits)
    return invalid(fits.error().message, pointer);
  return info;
}

}  // namespace joule::worker
