#include "joule/adapters/control_journal.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "control_files.hpp"

namespace joule::adapters {
namespace {

using nlohmann::json;

Error journal_error(const std::filesystem::path& file, std::string_view what) {
  return make_error(ErrorCode::io, fmt::format("control journal {}: {}", file.string(), what));
}

// write(2) all of `text` to `fd`, then fsync.
int write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    text.remove_prefix(static_cast<std::size_t>(n));
  }
  return ::fsync(fd) == 0 ? 0 : errno;
}

}  // namespace

Result<ControlJournal> ControlJournal::open(std::filesystem::path file) {
  ControlJournal journal(std::move(file));
  std::ifstream in(journal.file_);
  if (!in) return journal;  // none yet
  std::stringstream text;
  text << in.rdbuf();
  json parsed = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object() || !parsed.contains("entries") || !parsed["entries"].is_array())
    return journal_error(journal.file_,
                         "not a journal (expected {\"entries\": [...]}); move it away once its "
                         "settings are checked by hand");
  for (std::size_t i = 0; i < parsed["entries"].size(); ++i) {
    const json& e = parsed["entries"][i];
    if (!e.is_object() || !e.value("key", json()).is_string() || !e.value("kind", json()).is_string() ||
        !e.value("original", json()).is_string())
      return journal_error(journal.file_, fmt::format("/entries/{} lacks key, kind or original", i));
    journal.entries_.push_back(Entry{e["key"], e["kind"], e["original"], e.value("index", 0u)});
  }
  return journal;
}

Status ControlJournal::remember(Entry entry) {
  if (std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.key == entry.key; })) return {};
  entries_.push_back(std::move(entry));
  if (auto saved = save(); !saved) {
    entries_.pop_back();
    return saved;
  }
  return {};
}

Status ControlJournal::forget(const std::string& key) {
  const auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.key == key; });
  if (it == entries_.end()) return {};
  const Entry gone = *it;
  entries_.erase(it);
  if (auto saved = save(); !saved) {
    entries_.push_back(gone);
    return saved;
  }
  return {};
}

Status ControlJournal::save() const {
  json entries = json::array();
  for (const Entry& e : entries_)
    entries.push_back({{"key", e.key}, {"kind", e.kind}, {"original", e.original}, {"index", e.index}});
  const std::string text = json{{"entries", entries}}.dump(1) + "\n";
  const auto temporary = std::filesystem::path(file_.string() + ".tmp");
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return detail::file_error(errno, "create", temporary, "the state directory must be writable");
  const int err = write_all(fd, text);
  ::close(fd);
  if (err != 0) return detail::file_error(err, "write", temporary, "the state directory must be writable");
  if (::rename(temporary.c_str(), file_.c_str()) != 0)
    return detail::file_error(errno, "rename into place", temporary, "the state directory must be writable");
  // The rename itself is durable only once the directory is.
  const auto directory = file_.parent_path().empty() ? std::filesystem::path(".") : file_.parent_path();
  if (const int dir = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir >= 0) {
    (void)::fsync(dir);
    ::close(dir);
  }
  return {};
}

std::vector<std::string> restore_journalled(ControlJournal& journal, const ControlFiles& files,
                                            const std::function<Status(const ControlJournal::Entry&)>& restore_other) {
  std::vector<std::string> lines;
  const ControlFiles real = detail::complete(files);
  const auto entries = journal.entries();  // a copy: forget() changes the list
  for (const auto& entry : entries) {
    Status restored;
    if (entry.kind == "file") {
      if (const int err = real.write(entry.key, entry.original))
        restored = detail::file_error(err, "write back", entry.key, "jouled needs write access to it, as root has");
    } else if (restore_other) {
      restored = restore_other(entry);
    } else {
      restored = make_error(ErrorCode::unavailable, fmt::format("nothing here restores a {} setting", entry.kind));
    }
    if (!restored) {
      lines.push_back(fmt::format("cannot restore {} to {} (kept for the next start): {}", entry.key, entry.original,
                                  restored.error().message));
      continue;
    }
    if (auto forgotten = journal.forget(entry.key); !forgotten) {
      lines.push_back(fmt::format("restored {} to {}, but {}", entry.key, entry.original, forgotten.error().message));
      continue;
    }
    lines.push_back(fmt::format("restored {} to {}", entry.key, entry.original));
  }
  return lines;
}

}  // namespace joule::adapters
