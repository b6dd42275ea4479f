#include "joule/schedulers/job_queue.hpp"

#include <algorithm>
#include <iterator>

namespace joule::schedulers {

void JobQueue::push(const std::string& job_id, int priority, std::int64_t sequence) {
  erase(job_id);
  Key key{-priority, sequence, job_id};
  order_.insert(key);
  index_.emplace(job_id, std::move(key));
}

void JobQueue::erase(const std::string& job_id) {
  const auto it = index_.find(job_id);
  if (it == index_.end()) return;
  order_.erase(it->second);
  index_.erase(it);
}

std::vector<std::string> JobQueue::first(std::size_t limit) const {
  std::vector<std::string> out;
  out.reserve(std::min(limit, order_.size()));
  for (const auto& key : order_) {
    if (out.size() >= limit) break;
    out.push_back(std::get<2>(key));
  }
  return out;
}

std::optional<std::size_t> JobQueue::position(const std::string& job_id) const {
  const auto it = index_.find(job_id);
  if (it == index_.end()) return std::nullopt;
  return static_cast<std::size_t>(order_.order_of_key(it->second));
}

std::optional<std::string> JobQueue::next(const std::function<bool(const std::string&)>& eligible) const {
  for (const auto& key : order_) {
    if (eligible(std::get<2>(key))) return std::get<2>(key);
  }
  return std::nullopt;
}

}  // namespace joule::schedulers
