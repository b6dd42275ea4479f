#pragma once
// Which route a request reaches: a table of (verb, path template, value), looked up by a
// request's verb and decoded path segments. A path that exists under other verbs is a
// WrongMethod whose Allow list comes from the table, never typed by hand. Pure: no I/O, no JSON.

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <boost/beast/http/verb.hpp>

namespace joule::daemon {

/// Routes of one value type (the API's is a handler with its access rule).
template <class Value>
class Router {
 public:
  using Verb = boost::beast::http::verb;

  /// A request that reached a route, with the `{name}` segments of its template.
  struct Found {
    const Value* value;
    const std::string* pattern;  ///< e.g. "/v1/jobs/{id}/log": the route's name in metrics
    std::map<std::string, std::string> params;
  };
  /// The path exists, but not for this verb: a 405 with `allow` ("GET, HEAD, POST").
  struct WrongMethod {
    const std::string* pattern;
    std::string allow;
  };
  struct NotFound {};
  using Lookup = std::variant<Found, WrongMethod, NotFound>;

  /// Adds `value` for `verb` at `pattern`: "/"-separated literal segments and `{name}` segments
  /// that match any one segment. A GET route answers HEAD too (RFC 9110 9.3.2). Adding the same
  /// verb and template twice is a programming error (std::logic_error).
  void add(Verb verb, std::string_view pattern, Value value) {
    Path& path = path_for(pattern);
    if (path.handlers.contains(verb)) throw std::logic_error("route added twice: " + std::string(pattern));
    path.handlers.emplace(verb, std::move(value));
  }

  /// The route for `verb` at `segments` (already percent-decoded). Where templates overlap, the
  /// one with the most literal segments wins ("/v1/jobs/pause" over "/v1/jobs/{id}").
  Lookup find(Verb verb, const std::vector<std::string>& segments) const {
    const Path* best = nullptr;
    for (const Path& path : paths_) {
      if (!matches(path, segments)) continue;
      if (!best || path.literals > best->literals) best = &path;
    }
    if (!best) return NotFound{};
    auto handler = best->handlers.find(verb);
    if (handler == best->handlers.end() && verb == Verb::head) handler = best->handlers.find(Verb::get);
    if (handler == best->handlers.end()) return WrongMethod{&best->pattern, allow(*best)};
    Found found{&handler->second, &best->pattern, {}};
    for (std::size_t i = 0; i < segments.size(); ++i) {
      if (!best->names[i].empty()) found.params.emplace(best->names[i], segments[i]);
    }
    return found;
  }

  /// Every (verb, template) in the order the templates were first added: for listings and docs.
  std::vector<std::pair<Verb, std::string>> routes() const {
    std::vector<std::pair<Verb, std::string>> out;
    for (const Path& path : paths_)
      for (const auto& [verb, value] : path.handlers) out.emplace_back(verb, path.pattern);
    return out;
  }

 private:
  struct Path {
    std::string pattern;
    std::vector<std::string> literals_and_params;  ///< each segment; a parameter as ""
    std::vector<std::string> names;                ///< the parameter's name, or "" for a literal
    int literals = 0;
    std::map<Verb, Value> handlers;
  };

  Path& path_for(std::string_view pattern) {
    for (Path& path : paths_)
      if (path.pattern == pattern) return path;
    Path path;
    path.pattern = std::string(pattern);
    std::size_t start = 0;
    while (start < pattern.size()) {
      auto slash = pattern.find('/', start);
      if (slash == std::string_view::npos) slash = pattern.size();
      const std::string_view piece = pattern.substr(start, slash - start);
      if (!piece.empty()) {
        const bool parameter = piece.size() > 2 && piece.front() == '{' && piece.back() == '}';
        path.literals_and_params.emplace_back(parameter ? std::string_view() : piece);
        path.names.emplace_back(parameter ? piece.substr(1, piece.size() - 2) : std::string_view());
        if (!parameter) ++path.literals;
      }
      start = slash + 1;
    }
    paths_.push_back(std::move(path));
    return paths_.back();
  }

  static bool matches(const Path& path, const std::vector<std::string>& segments) {
    if (path.names.size() != segments.size()) return false;
    for (std::size_t i = 0; i < segments.size(); ++i) {
      if (path.names[i].empty() && path.literals_and_params[i] != segments[i]) return false;
      if (!path.names[i].empty() && segments[i].empty()) return false;
    }
    return true;
  }

  // RFC 9110 10.2.1: the methods the target supports; HEAD wherever GET is.
  static std::string allow(const Path& path) {
    std::vector<std::string> verbs;
    for (const auto& [verb, value] : path.handlers) {
      verbs.emplace_back(boost::beast::http::to_string(verb));
      if (verb == Verb::get && !path.handlers.contains(Verb::head)) verbs.emplace_back("HEAD");
    }
    std::sort(verbs.begin(), verbs.end());
    std::string out;
    for (const auto& verb : verbs) out += (out.empty() ? "" : ", ") + verb;
    return out;
  }

  std::vector<Path> paths_;  // few (~20): a linear scan beats any index at this size
};

}  // namespace joule::daemon
