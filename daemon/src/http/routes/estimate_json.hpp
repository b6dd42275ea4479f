#pragma once
// POST /v1/estimate and /v1/advise as the API reads and answers them: the request's body parsed
// into an EstimateRequest (errors name the field by JSON pointer), the typed answer written out,
// and the pruning advice, whose answer is the estimator's advice written out.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/common/result.hpp"
#include "joule/daemon/estimates.hpp"

namespace joule::daemon::routes {

/// `{"model": ..., "training": ..., "devices": ["pattern"...], "runtime": "python" | "none"}`.
Result<EstimateRequest> parse_estimate_request(const nlohmann::json& body);
/// `{"model": {"layers", "parameters", "flops_per_step"}, "steps", "estimates": [row...]}`.
nlohmann::json estimate_answer_json(const EstimateAnswer& answer);

/// POST /v1/advise: `{"model", "training", "target", "device"?, "min_multiplier"?}`, energy-aware
/// pruning advice (estimator/pruning_advice.hpp) from one device's model (the one named, or
/// the first of `devices` that has a model), with the advised network's saving estimated on
/// every device that has a model. Errors name the field by JSON pointer; no device with a model
/// is a 503 that says how to get one.
Result<nlohmann::json> advise_request(const nlohmann::json& body, const std::vector<std::string>& devices,
                                      const DeviceModels& models);

}  // namespace joule::daemon::routes
