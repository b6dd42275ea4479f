#include "joule/daemon/router.hpp"

#include <gtest/gtest.h>

namespace {

using joule::daemon::Router;
using Verb = boost::beast::http::verb;
using Table = Router<std::string>;

Table jobs_table() {
  Table table;
  table.add(Verb::get, "/v1/jobs", "list");
  table.add(Verb::post, "/v1/jobs", "submit");
  table.add(Verb::get, "/v1/jobs/{id}", "show");
  table.add(Verb::delete_, "/v1/jobs/{id}", "cancel");
  table.add(Verb::get, "/v1/jobs/{id}/log", "log");
  table.add(Verb::post, "/v1/jobs/{id}/pause", "pause");
  table.add(Verb::post, "/v1/cluster/sync", "sync");
  return table;
}

const Table::Found& found(const Table::Lookup& lookup) {
  EXPECT_TRUE(std::holds_alternative<Table::Found>(lookup));
  return std::get<Table::Found>(lookup);
}

}  // namespace

TEST(RouterTest, a_request_reaches_its_verbs_route_with_the_templates_parameters) {
  const Table table = jobs_table();
  auto lookup = table.find(Verb::get, {"v1", "jobs", "abc", "log"});
  ASSERT_TRUE(std::holds_alternative<Table::Found>(lookup));
  EXPECT_EQ(*found(lookup).value, "log");
  EXPECT_EQ(*found(lookup).pattern, "/v1/jobs/{id}/log");
  EXPECT_EQ(found(lookup).params.at("id"), "abc");
  EXPECT_EQ(*found(table.find(Verb::delete_, {"v1", "jobs", "abc"})).value, "cancel");
  EXPECT_EQ(*found(table.find(Verb::post, {"v1", "jobs"})).value, "submit");
}

TEST(RouterTest, head_reaches_the_get_route_and_allow_lists_it) {
  const Table table = jobs_table();
  EXPECT_EQ(*found(table.find(Verb::head, {"v1", "jobs"})).value, "list");
  auto wrong = table.find(Verb::put, {"v1", "jobs"});
  ASSERT_TRUE(std::holds_alternative<Table::WrongMethod>(wrong));
  EXPECT_EQ(std::get<Table::WrongMethod>(wrong).allow, "GET, HEAD, POST");
  auto post_only = table.find(Verb::get, {"v1", "cluster", "sync"});
  ASSERT_TRUE(std::holds_alternative<Table::WrongMethod>(post_only));
  EXPECT_EQ(std::get<Table::WrongMethod>(post_only).allow, "POST");
  EXPECT_EQ(*std::get<Table::WrongMethod>(post_only).pattern, "/v1/cluster/sync");
}

TEST(RouterTest, unknown_paths_and_empty_parameters_are_not_found) {
  const Table table = jobs_table();
  for (const std::vector<std::string>& segments :
       std::vector<std::vector<std::string>>{{}, {"v1"}, {"v2", "jobs"}, {"v1", "jobs", "a", "b", "c"}, {"v1", "jobs", ""}})
    EXPECT_TRUE(std::holds_alternative<Table::NotFound>(table.find(Verb::get, segments)));
}

TEST(RouterTest, the_template_with_more_literal_segments_wins_whatever_the_order) {
  Table table;
  table.add(Verb::get, "/v1/jobs/{id}", "show");
  table.add(Verb::get, "/v1/jobs/summary", "summary");
  EXPECT_EQ(*found(table.find(Verb::get, {"v1", "jobs", "summary"})).value, "summary");
  EXPECT_EQ(*found(table.find(Verb::get, {"v1", "jobs", "other"})).value, "show");
}

TEST(RouterTest, a_route_added_twice_is_a_programming_error_and_routes_are_listed) {
  Table table = jobs_table();
  EXPECT_THROW(table.add(Verb::get, "/v1/jobs", "again"), std::logic_error);
  const auto routes = table.routes();
  EXPECT_EQ(routes.size(), 7u);
  EXPECT_EQ(routes.front().second, "/v1/jobs");
}
