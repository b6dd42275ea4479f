#include "joule/cluster/node_registry.hpp"

#include <algorithm>

namespace joule::cluster {

std::string_view to_string(NodeState state) {
  switch (state) {
    case NodeState::joining: return "joining";
    case NodeState::ready: return "ready";
    case NodeState::lost: return "lost";
  }
  return "?";
}

namespace {
bool same_devices(const std::vector<ReportedDevice>& a, const std::vector<ReportedDevice>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name || a[i].runs_jobs != b[i].runs_jobs || a[i].source != b[i].source) return false;
  return true;
}
}  // namespace

NodeRegistry::Heard NodeRegistry::heard_from(const SyncRequest& request, Millis now) {
  Heard heard;
  auto [it, inserted] = nodes_.try_emplace(request.node);
  NodeRecord& node = it->second;
  heard.new_node = inserted;
  if (inserted) node.name = request.node;
  heard.came_back = node.state == NodeState::lost;
  heard.joined = !inserted && node.state == NodeState::joining;
  heard.restarted = !inserted && !node.incarnation.empty() && node.incarnation != request.incarnation;
  heard.devices_changed = !same_devices(node.devices, request.devices);
  if (node.state != NodeState::ready) node.since = now;
  node.state = NodeState::ready;
  node.last_heard = now;
  node.incarnation = request.incarnation;
  node.version = request.version;
  node.devices = request.devices;
  return heard;
}

void NodeRegistry::expect(const std::string& node, Millis now) {
  auto [it, inserted] = nodes_.try_emplace(node);
  if (!inserted) return;
  it->second.name = node;
  it->second.since = now;
}

Millis NodeRegistry::deadline(const NodeRecord& node) const {
  // Heard from since this coordinator started: the lease runs from then; otherwise from start.
  return std::max(node.last_heard.value_or(started_), started_) + lease_;
}

std::vector<std::string> NodeRegistry::expire(Millis now) {
  std::vector<std::string> lost;
  for (auto& [name, node] : nodes_) {
    if (node.state == NodeState::lost || now < deadline(node)) continue;
    node.state = NodeState::lost;
    node.since = now;
    lost.push_back(name);
  }
  return lost;
}

std::optional<Millis> NodeRegistry::next_expiry() const {
  std::optional<Millis> next;
  for (const auto& [name, node] : nodes_) {
    if (node.state == NodeState::lost) continue;
    const Millis at = deadline(node);
    if (!next || at < *next) next = at;
  }
  return next;
}

const NodeRecord* NodeRegistry::find(const std::string& name) const {
  const auto it = nodes_.find(name);
  return it == nodes_.end() ? nullptr : &it->second;
}

}  // namespace joule::cluster
