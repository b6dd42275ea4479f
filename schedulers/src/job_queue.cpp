#include "joule/schedulers/job_queue.hpp"

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

std::optional<std::string> JobQueue::next(const std::function<bool(const std::string&)>& eligible) const {
  for (const auto& key : order_) {
    if (eligible(std::get<2>(key))) return std::get<2>(key);
  }
  return std::nullopt;
}

}  // namespace joule::schedulers
