#pragma once
// Keeps one of this node's grid signals current, its carbon intensity ([carbon]) or its price
// ([price]): every refresh period it re-reads the file when the file changed, or fetches the URL
// on a thread of its own (a slow API never holds the event loop), and hands what parsed, or why
// nothing did, to a GridSignalFeed on the loop. The previous good signal stays in force through
// any failure; each new failure is logged once.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <boost/asio/io_context.hpp>

#include "joule/common/clock.hpp"
#include "joule/common/result.hpp"
#include "joule/config/daemon_config.hpp"
#include "joule/config/grid_signal_file.hpp"
#include "joule/daemon/clock_timer.hpp"
#include "joule/daemon/grid_signal_feed.hpp"
#include "joule/daemon/metrics.hpp"

namespace joule::daemon {

class SignalService {
 public:
  SignalService(boost::asio::io_context& io, Metrics& metrics, config::SignalConfig config, config::SignalKind kind,
                const Clock& clock);
  ~SignalService();
  SignalService(const SignalService&) = delete;
  SignalService& operator=(const SignalService&) = delete;

  /// Reads a file at once (the first placement pass has it), starts fetching a URL, and
  /// refreshes every period from then on. Nothing to do without its section.
  void start();
  /// Stops the timer and the fetching thread (joined: nothing reaches the loop after).
  void stop();
  /// A reload's section: a new source starts over (a file read at once, a URL fetched); the
  /// same source with other settings keeps the signal it has. Unchanged: nothing happens.
  void reconfigure(config::SignalConfig config);

  bool configured() const { return config_.configured(); }
  /// Called on the loop whenever a load replaced the signal.
  void on_change(std::function<void()> changed) { changed_ = std::move(changed); }
  const GridSignalFeed& feed() const { return feed_; }
  config::SignalKind kind() const { return kind_; }
  schedulers::UnixMillis now_ms() const { return clock_.unix_ms(); }
  /// GET /v1/signals: {"carbon" or "price": the feed's description, with the refresh period}.
  nlohmann::json describe() const;
  /// The same for a node without the section.
  static nlohmann::json describe_none(config::SignalKind kind);

 private:
  void refresh();
  void read_file();
  void fetch_loop();
  void accept(Result<schedulers::GridSignal> signal);
  void publish();

  boost::asio::io_context& io_;
  Metrics& metrics_;
  config::SignalConfig config_;
  config::SignalKind kind_;
  std::string name_;  // "carbon", "price": its section, and in logs
  const Clock& clock_;
  GridSignalFeed feed_;
  std::function<void()> changed_;
  ClockTimer timer_;
  // The file as last read, good or bad: unchanged, it is not parsed again.
  struct FileStamp {
    std::int64_t modified_ns = 0;
    std::uintmax_t size = 0;
    bool operator==(const FileStamp&) const = default;
  };
  std::optional<FileStamp> read_stamp_;
  // The URL's fetching thread: woken each period, posts its result to the loop.
  std::thread fetcher_;
  std::mutex wake_mutex_;
  std::condition_variable wake_;
  bool fetch_wanted_ = false;
  schedulers::UnixMillis fetch_at_ = 0;  // when the fetch was asked for: the URL's {now}
  bool stopping_ = false;
  std::shared_ptr<std::atomic<bool>> alive_ = std::make_shared<std::atomic<bool>>(true);
};

}  // namespace joule::daemon
