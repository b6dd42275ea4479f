#include "joule/estimator/knob_response.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <Eigen/Dense>

namespace joule::estimator {

NetworkFeatures network_features(const std::vector<AnalyzedLayer>& layers) {
  NetworkFeatures features;
  double bytes = 0.0;
  for (const auto& layer : layers) {
    features.flops += layer.cost.forward_flops + layer.cost.backward_flops;
    bytes += layer.cost.activation_bytes + layer.cost.parameter_bytes;
  }
  features.intensity = bytes > 0.0 ? features.flops / bytes : 0.0;
  return features;
}

std::string KnobSetting::key() const { return fmt::format("{}={:g}", knob, value); }

nlohmann::json to_json(const KnobSetting& setting) {
  return {{"knob", setting.knob}, {"value", setting.value}, {"label", setting.label}};
}

Result<KnobSetting> knob_setting_from_json(const nlohmann::json& in, const std::string& pointer) {
  if (!in.is_object()) return make_error(ErrorCode::invalid_argument, "not an object", pointer);
  KnobSetting out;
  const auto knob = in.find("knob");
  if (knob == in.end() || !knob->is_string() || knob->get<std::string>().empty())
    return make_error(ErrorCode::invalid_argument, "must be a knob's name", pointer + "/knob");
  out.knob = knob->get<std::string>();
  const auto value = in.find("value");
  if (value == in.end() || !value->is_number() || !(value->get<double>() > 0.0) || !std::isfinite(value->get<double>()))
    return make_error(ErrorCode::invalid_argument, "must be a positive number", pointer + "/value");
  out.value = value->get<double>();
  const auto label = in.find("label");
  out.label = label != in.end() && label->is_string() ? label->get<std::string>() : out.key();
  return out;
}

namespace {

Eigen::Vector4d row(const NetworkFeatures& features, std::optional<double> power_limit_watts) {
  const double flops = std::log10(std::max(features.flops, 1.0));
  const double intensity = std::log10(std::max(features.intensity, 1e-3));
  if (power_limit_watts) {
    const double over = std::max(0.0, std::log(std::max(features.watts, 1e-9) / *power_limit_watts));
    return {over, over * intensity, 0.0, 0.0};
  }
  return {1.0, flops, intensity, std::log(std::max(features.watts, 1e-3))};
}

}  // namespace

Result<KnobResponse> KnobResponse::fit(const std::vector<KnobSample>& samples,
                                       std::optional<double> power_limit_watts) {
  std::vector<const KnobSample*> usable;
  for (const auto& sample : samples)
    if (sample.time_ratio > 0.0 && sample.energy_ratio > 0.0 && std::isfinite(sample.time_ratio) &&
        std::isfinite(sample.energy_ratio))
      usable.push_back(&sample);
  if (usable.size() < 4)
    return make_error(ErrorCode::invalid_argument,
                      fmt::format("a knob response needs 4 measured networks, {} usable", usable.size()));
  const auto n = static_cast<Eigen::Index>(usable.size());
  Eigen::MatrixXd x(n, 4);
  Eigen::VectorXd time(n), energy(n);
  for (Eigen::Index i = 0; i < n; ++i) {
    x.row(i) = row(usable[i]->features, power_limit_watts).transpose();
    time(i) = std::log(usable[i]->time_ratio);
    energy(i) = std::log(usable[i]->energy_ratio);
  }
  // A little ridge on all but the first column: probe networks can share a size, an intensity
  // or a power, and a singular design must still give the mean ratio rather than nonsense.
  Eigen::Matrix4d gram = x.transpose() * x;
  gram.diagonal().tail(3).array() += 1e-3 * static_cast<double>(n);
  gram(0, 0) += 1e-9;
  const Eigen::LDLT<Eigen::Matrix4d> solver(gram);
  const Eigen::Vector4d time_fit = solver.solve(x.transpose() * time);
  const Eigen::Vector4d energy_fit = solver.solve(x.transpose() * energy);
  KnobResponse response;
  response.power_limit_watts_ = power_limit_watts;
  const Eigen::Matrix4d inverse = solver.solve(Eigen::Matrix4d::Identity());
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) response.inverse_gram_[r][c] = inverse(r, c);
  for (int k = 0; k < 4; ++k) {
    response.time_[k] = time_fit(k);
    response.energy_[k] = energy_fit(k);
  }
  const double dof = std::max<double>(1.0, static_cast<double>(n) - 4.0);
  response.time_std_ = std::sqrt((x * time_fit - time).squaredNorm() / dof);
  response.energy_std_ = std::sqrt((x * energy_fit - energy).squaredNorm() / dof);
  response.samples_ = usable.size();
  return response;
}

RatioPrediction KnobResponse::predict(const NetworkFeatures& features) const {
  const Eigen::Vector4d x = row(features, power_limit_watts_);
  RatioPrediction out;
  double time = 0.0, energy = 0.0;
  for (int k = 0; k < 4; ++k) {
    time += time_[k] * x(k);
    energy += energy_[k] * x(k);
  }
  // A power limit only ever slows a job: whatever the fit says below 1 is its error.
  out.time_ratio = power_limit_watts_ ? std::exp(std::max(0.0, time)) : std::exp(time);
  out.energy_ratio = std::exp(energy);
  double leverage = 0.0;
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) leverage += x(r) * inverse_gram_[r][c] * x(c);
  const double widen = std::sqrt(1.0 + std::max(0.0, leverage));
  out.time_log_std = time_std_ * widen;
  out.energy_log_std = energy_std_ * widen;
  return out;
}

}  // namespace joule::estimator
