#include "joule/cluster/node_registry.hpp"
#include "joule/cluster/sync.hpp"

#include <gtest/gtest.h>

namespace joule::cluster {
namespace {

using nlohmann::json;

SyncRequest request(std::string node, std::string incarnation = "i1") {
  SyncRequest r;
  r.node = std::move(node);
  r.incarnation = std::move(incarnation);
  r.devices.push_back(ReportedDevice{"sim:jetson-orin", "simulated", 12.5, 7.0, true, false, std::nullopt, std::nullopt, 3});
  ReportedJob job;
  job.id = "j1";
  job.epoch = 2;
  job.state = "running";
  job.energy_joules = 4.5;
  job.energy_source = "simulated";
  r.jobs.push_back(job);
  return r;
}

TEST(SyncProtocolTest, request_and_reply_round_trip_through_json) {
  const auto parsed = parse_sync_request(to_json(request("edge-1")));
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(parsed->node, "edge-1");
  EXPECT_EQ(parsed->devices.at(0).model_version, 3);
  EXPECT_DOUBLE_EQ(*parsed->jobs.at(0).energy_joules, 4.5);
  EXPECT_FALSE(parsed->jobs.at(0).fenced);
  auto fenced = request("edge-1");
  fenced.jobs.at(0).state = "cancelled";
  fenced.jobs.at(0).fenced = true;
  EXPECT_TRUE(parse_sync_request(to_json(fenced))->jobs.at(0).fenced);
  // An agent of the version before says nothing of fencing: not fenced.
  auto older = to_json(fenced);
  older["jobs"][0].erase("fenced");
  EXPECT_FALSE(parse_sync_request(older)->jobs.at(0).fenced);

  SyncReply reply;
  Assignment a;
  a.id = "j1";
  a.epoch = 2;
  a.device = "cpu";
  a.spec = {{"name", "x"}};
  reply.jobs.push_back(a);
  reply.digest = digest_of(reply.jobs);
  reply.recorded = {{"j0", 1}};
  reply.model_versions = {{"cpu", 4}};
  const auto back = parse_sync_reply(to_json(reply));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->jobs.at(0).spec["name"], "x");
  EXPECT_EQ(back->recorded.at(0).second, 1);
  EXPECT_EQ(back->model_versions.at("cpu"), 4);
  EXPECT_EQ(back->digest, digest_of(back->jobs));
}

TEST(SyncProtocolTest, bad_input_names_its_json_pointer) {
  json body = to_json(request("edge-1"));
  body["jobs"][0]["epoch"] = "two";
  auto parsed = parse_sync_request(body);
  ASSERT_FALSE(parsed);
  EXPECT_EQ(parsed.error().where, "/jobs/0/epoch");
  body = to_json(request("edge/1"));
  parsed = parse_sync_request(body);
  ASSERT_FALSE(parsed);
  EXPECT_EQ(parsed.error().where, "/node");
  body = to_json(request("edge-1"));
  body["devices"][0].erase("energy_joules");
  parsed = parse_sync_request(body);
  ASSERT_FALSE(parsed);
  EXPECT_EQ(parsed.error().where, "/devices/0/energy_joules");
  EXPECT_NE(parsed.error().message.find("missing"), std::string::npos);
}

TEST(SyncProtocolTest, an_agents_own_signals_travel_whole_only_when_sent_and_their_digest_follows_them) {
  using joule::cluster::ReportedSignal;
  using joule::schedulers::GridSignal;
  joule::cluster::SyncRequest request;
  request.node = "orin";
  request.incarnation = "i";
  ReportedSignal carbon{GridSignal::from_points({{1000, 400.0}, {3'601'000, 90.5}}, 7'201'000).value(),
                        "file /srv/carbon.csv", ""};
  ReportedSignal price{GridSignal::from_points({{0, 0.25}}).value(), "constant 0.25 EUR/kWh", "EUR"};
  request.signals_digest = joule::cluster::digest_of_signals(carbon, price);
  EXPECT_FALSE(request.signals_digest.empty());
  EXPECT_TRUE(joule::cluster::digest_of_signals(std::nullopt, std::nullopt).empty());
  EXPECT_NE(joule::cluster::digest_of_signals(carbon, std::nullopt), request.signals_digest);
  // Not sent: only the digest goes.
  auto parsed = joule::cluster::parse_sync_request(joule::cluster::to_json(request));
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_FALSE(parsed->signals_sent);
  EXPECT_EQ(parsed->signals_digest, request.signals_digest);
  // Sent: whole, and the digest of what arrived is the one sent.
  request.signals_sent = true;
  request.carbon = carbon;
  request.price = price;
  parsed = joule::cluster::parse_sync_request(joule::cluster::to_json(request));
  ASSERT_TRUE(parsed) << parsed.error().message;
  ASSERT_TRUE(parsed->signals_sent && parsed->carbon && parsed->price);
  EXPECT_EQ(parsed->carbon->signal.points().size(), 2u);
  EXPECT_EQ(parsed->carbon->signal.end(), 7'201'000);
  EXPECT_EQ(parsed->carbon->label, "file /srv/carbon.csv");
  EXPECT_EQ(parsed->price->currency, "EUR");
  EXPECT_EQ(joule::cluster::digest_of_signals(parsed->carbon, parsed->price), request.signals_digest);
  // A bad signal is named by its pointer.
  auto body = joule::cluster::to_json(request);
  body["signals"]["carbon"]["points"][1] = {500, 10.0};  // before the point ahead of it
  const auto bad = joule::cluster::parse_sync_request(body);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("/signals/carbon: point 1"), std::string::npos) << bad.error().message;
}

TEST(SyncProtocolTest, the_digest_changes_with_what_the_agent_acts_on) {
  Assignment a;
  a.id = "j1";
  a.epoch = 1;
  a.device = "cpu";
  const auto before = digest_of({a});
  a.paused = true;
  EXPECT_NE(digest_of({a}), before);
  a.paused = false;
  EXPECT_EQ(digest_of({a}), before);
  a.epoch = 2;
  EXPECT_NE(digest_of({a}), before);
}

TEST(NodeRegistryTest, a_silent_node_is_lost_once_after_the_lease_and_comes_back) {
  NodeRegistry nodes(10'000, 0);
  auto heard = nodes.heard_from(request("a"), 1'000);
  EXPECT_TRUE(heard.new_node);
  EXPECT_EQ(nodes.find("a")->state, NodeState::ready);
  EXPECT_EQ(*nodes.next_expiry(), 11'000);
  EXPECT_TRUE(nodes.expire(10'999).empty());
  EXPECT_EQ(nodes.expire(11'000), std::vector<std::string>{"a"});
  EXPECT_TRUE(nodes.expire(20'000).empty());  // reported once
  EXPECT_EQ(nodes.find("a")->state, NodeState::lost);
  EXPECT_FALSE(nodes.next_expiry());
  heard = nodes.heard_from(request("a"), 21'000);
  EXPECT_TRUE(heard.came_back);
  EXPECT_FALSE(heard.restarted);
  heard = nodes.heard_from(request("a", "i2"), 22'000);
  EXPECT_TRUE(heard.restarted);
}

TEST(NodeRegistryTest, nodes_known_from_state_get_a_lease_from_the_coordinators_start) {
  NodeRegistry nodes(10'000, 50'000);
  nodes.expect("b", 50'000);
  EXPECT_EQ(nodes.find("b")->state, NodeState::joining);
  EXPECT_TRUE(nodes.expire(59'999).empty());
  EXPECT_EQ(nodes.expire(60'000), std::vector<std::string>{"b"});
}

}  // namespace
}  // namespace joule::cluster
