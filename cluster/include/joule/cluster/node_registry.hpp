#pragma once
// The coordinator's view of its agents: who was heard from when, and who is lost. Pure: every
// call is given the time.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "joule/cluster/sync.hpp"

namespace joule::cluster {

using Millis = std::int64_t;

/// joining: known (from stored jobs, or just registered) but not heard from since this
/// coordinator started; ready: heard from within the lease; lost: silent past the lease.
enum class NodeState { joining, ready, lost };
std::string_view to_string(NodeState state);

struct NodeRecord {
  std::string name;
  NodeState state = NodeState::joining;
  std::optional<Millis> last_heard;
  Millis since = 0;  ///< when it entered its state
  std::string incarnation;
  std::string version;
  std::vector<ReportedDevice> devices;
};

class NodeRegistry {
 public:
  /// `started` is when this coordinator started: a node it knows from its state has until
  /// started + lease to be heard from before it is lost.
  NodeRegistry(Millis lease, Millis started) : lease_(lease), started_(started) {}

  /// What hearing from a node changed.
  struct Heard {
    bool new_node = false;      ///< never seen before
    bool came_back = false;     ///< it was lost
    bool restarted = false;     ///< a new incarnation of an agent heard before
    bool joined = false;        ///< it was joining (known from stored jobs) and is now ready
    bool devices_changed = false;
  };
  Heard heard_from(const SyncRequest& request, Millis now);
  /// A node that stored jobs name: joining until heard from.
  void expect(const std::string& node, Millis now);
  /// Nodes that became lost by `now` (each reported once, when it happens).
  std::vector<std::string> expire(Millis now);
  /// When the next node would be lost if nothing is heard (none: no live node).
  std::optional<Millis> next_expiry() const;

  const NodeRecord* find(const std::string& name) const;
  const std::map<std::string, NodeRecord>& nodes() const { return nodes_; }
  Millis lease() const { return lease_; }
  void set_lease(Millis lease) { lease_ = lease; }

 private:
  Millis deadline(const NodeRecord& node) const;

  Millis lease_;
  Millis started_;
  std::map<std::string, NodeRecord> nodes_;
};

}  // namespace joule::cluster
