#pragma once
// The devices as the API shows them (GET /v1/devices, a node's devices in GET /v1/nodes): each
// one's meter and its source, power and energy, the job on it, the knobs it offers and its
// energy model. Rendered from the device table; nothing here changes it.

#include <string>

#include <nlohmann/json.hpp>

#include "joule/daemon/device_table.hpp"
#include "joule/daemon/estimate_service.hpp"

namespace joule::daemon {

/// What a device offers jobs' `knobs`: {"offered": {...}, "note"}.
nlohmann::json device_knobs(const Device& device);
/// GET /v1/devices: {"devices": [...]}; each model from `estimates` (none where it is nullptr).
nlohmann::json devices_view(const DeviceTable& devices, const EstimateService* estimates);
/// An agent's devices on its coordinator, under their agent's own names.
nlohmann::json node_devices_view(const DeviceTable& devices, const std::string& node, const EstimateService* estimates);

}  // namespace joule::daemon
