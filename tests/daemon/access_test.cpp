#include "joule/daemon/access.hpp"

#include <gtest/gtest.h>

#include "joule/common/sha256.hpp"

using joule::daemon::AccessConfig;
using joule::daemon::identify;
using joule::daemon::identify_agent;
using joule::daemon::Scope;

namespace {

AccessConfig with_tokens() {
  AccessConfig config;
  config.tokens = {{joule::sha256_hex("alice-secret"), "alice", joule::daemon::kSubmitScopes},
                   {joule::sha256_hex("viewer-secret"), "viewer", joule::daemon::kReadScopes},
                   {joule::sha256_hex("root-secret"), "ops", joule::daemon::kAdminScopes}};
  return config;
}

TEST(AccessTest, a_token_names_its_owner_and_scopes) {
  auto alice = identify(with_tokens(), "alice-secret", std::nullopt);
  ASSERT_TRUE(alice);
  EXPECT_EQ(alice->name, "token:alice");
  EXPECT_TRUE(alice->has(Scope::read));
  EXPECT_TRUE(alice->has(Scope::submit));
  EXPECT_FALSE(alice->has(Scope::admin));
  EXPECT_TRUE(alice->may_act_on("token:alice"));
  EXPECT_FALSE(alice->may_act_on("token:bob"));
  EXPECT_FALSE(alice->may_act_on(""));
  auto ops = identify(with_tokens(), "root-secret", std::nullopt);
  ASSERT_TRUE(ops);
  EXPECT_TRUE(ops->may_act_on("token:alice"));
  EXPECT_FALSE(ops->has(Scope::agent));
}

TEST(AccessTest, a_wrong_token_is_refused_even_from_a_known_local_user) {
  auto wrong = identify(with_tokens(), "guess", 1000u);
  ASSERT_FALSE(wrong);
  EXPECT_EQ(wrong.error().code, joule::ErrorCode::unauthorized);
}

TEST(AccessTest, a_loopback_client_without_a_token_is_its_local_user) {
  auto user = identify(with_tokens(), "", 1000u);
  ASSERT_TRUE(user);
  EXPECT_EQ(user->name, "uid:1000");
  EXPECT_EQ(user->uid, 1000u);
  EXPECT_TRUE(user->has(Scope::submit));
  EXPECT_FALSE(user->has(Scope::admin));
  auto root = identify(with_tokens(), "", 0u);
  ASSERT_TRUE(root);
  EXPECT_TRUE(root->has(Scope::admin));
}

TEST(AccessTest, local_users_can_be_limited_or_made_to_bring_a_token) {
  AccessConfig config = with_tokens();
  config.local_user_scopes = joule::daemon::kReadScopes;
  auto reader = identify(config, "", 1000u);
  ASSERT_TRUE(reader);
  EXPECT_FALSE(reader->has(Scope::submit));
  config.local_user_scopes = 0;
  EXPECT_FALSE(identify(config, "", 1000u));
  EXPECT_TRUE(identify(config, "", 0u)) << "root administers the machine it runs on";
}

TEST(AccessTest, a_remote_client_without_a_token_is_nobody) {
  auto nobody = identify(with_tokens(), "", std::nullopt);
  ASSERT_FALSE(nobody);
  EXPECT_EQ(nobody.error().code, joule::ErrorCode::unauthorized);
}

TEST(AccessTest, agents_sync_with_agent_tokens_only) {
  AccessConfig config = with_tokens();
  config.agent_tokens = {{joule::sha256_hex("agent-secret"), "agents", joule::daemon::kAgentScopes}};
  auto agent = identify_agent(config, "agent-secret", std::nullopt);
  ASSERT_TRUE(agent);
  EXPECT_TRUE(agent->has(Scope::agent));
  EXPECT_FALSE(agent->has(Scope::read));
  EXPECT_FALSE(identify_agent(config, "root-secret", std::nullopt)) << "an API token is no agent token";
  EXPECT_FALSE(identify(config, "agent-secret", std::nullopt)) << "an agent token opens no API route";
  EXPECT_FALSE(identify_agent(config, "", 0u));
}

TEST(AccessTest, without_agent_tokens_an_admin_token_syncs_and_without_any_token_a_local_admin) {
  EXPECT_TRUE(identify_agent(with_tokens(), "root-secret", std::nullopt));
  EXPECT_FALSE(identify_agent(with_tokens(), "alice-secret", std::nullopt));
  EXPECT_TRUE(identify_agent(AccessConfig{}, "", 0u));
  EXPECT_FALSE(identify_agent(AccessConfig{}, "", 1000u));
  EXPECT_FALSE(identify_agent(AccessConfig{}, "", std::nullopt));
}

TEST(AccessTest, scope_names_round_trip_and_unknown_names_are_named) {
  auto scopes = joule::daemon::scopes_from_names({"submit"});
  ASSERT_TRUE(scopes);
  EXPECT_EQ(joule::daemon::scope_names(*scopes), (std::vector<std::string>{"read", "submit"}));
  auto bad = joule::daemon::scopes_from_names({"root"});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("\"root\""), std::string::npos);
}

}  // namespace
