#pragma once
// Runs work on the event loop from another thread and waits for it: how the threads that block
// on the network or on Slurm's commands read and change the JobService, which lives on the loop.

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

namespace joule::daemon {

/// False, without waiting further, when the loop stopped or `stopping` was set before it ran.
inline bool run_on_loop(boost::asio::io_context& io, const std::function<void()>& work,
                        const std::atomic<bool>& stopping) {
  auto task = std::make_shared<std::packaged_task<void()>>(work);
  auto done = task->get_future();
  boost::asio::post(io, [task] { (*task)(); });
  while (done.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready)
    if (stopping || io.stopped()) return false;
  done.get();
  return true;
}

}  // namespace joule::daemon
