#pragma once
// POST /v1/estimate and /v1/advise as the API reads and answers them: the request's body parsed
// into an EstimateRequest (errors name the field by JSON pointer), the typed answer written out,
// and the pruning advice, whose answer is the estimator's advice written out.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "joule/common/result.hpp"
#include "joule/daemon/estimates.hpp"
#include "joule/schedulers/policy.hpp"

namespace joule::daemon::routes {

/// `{"model": ..., "training": ..., "devices": ["pattern"...], "runtime": "python" | "none"}`.
Result<EstimateRequest> parse_estimate_request(const nlohmann::json& body);
/// `{"model": {"layers", "parameters", "flops_per_step"}, "steps", "estimates": [row...]}`.
nlohmann::json estimate_answer_json(const EstimateAnswer& answer);
/// Where the policy has a knobs.goal, each row with settings gets `policy_choice`: the goal and
/// the setting it would run the job at on that device (null: the defaults), within the policy's
/// max_slowdown and saving energy at its risk, before any queue, budget or deadline.
void add_policy_choices(nlohmann::json& answer, const EstimateAnswer& estimated, const schedulers::Policy& policy);

/// POST /v1/advise: `{"model", "training", "target", "device"?, "min_multiplier"?}`, energy-aware
/// pruning advice (estimator/pruning_advice.hpp) from one device's model (the one named, or
/// the first of `devices` that has a model), with the advised network's saving estimated on
/// every device that has a model. Errors name the field by JSON pointer; no device with a model
/// is a 503 that says how to get one.
Result<nlohmann::json> advise_request(const nlohmann::json& body, const std::vector<std::string>& devices,
                                      const DeviceModels& models);

}  // namespace joule::daemon::routes
