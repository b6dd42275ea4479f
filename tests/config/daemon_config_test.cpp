#include "joule/config/daemon_config.hpp"

#include <gtest/gtest.h>

#include "temp_dir.hpp"

using joule::config::parse_config;

TEST(DaemonConfigTest, empty_file_keeps_the_embedded_defaults) {
  auto loaded = parse_config("", "jouled.toml");
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->config.server.host, "127.0.0.1");
  EXPECT_EQ(loaded->config.server.port, 8571);
  ASSERT_EQ(loaded->config.devices.size(), 1u);
  EXPECT_EQ(loaded->config.devices[0].name, "cpu");
  EXPECT_TRUE(loaded->warnings.empty());
}

TEST(DaemonConfigTest, the_shipped_example_is_valid) {
  auto loaded = joule::config::load_config_file(std::filesystem::path(JOULE_SOURCE_DIR) / "config/jouled.toml");
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_TRUE(loaded->warnings.empty());
  EXPECT_EQ(loaded->config.source, std::string(JOULE_SOURCE_DIR) + "/config/jouled.toml");
}

TEST(DaemonConfigTest, values_are_read) {
  auto loaded = parse_config(R"(
[server]
listen = "[::1]:9000"
max_queued_jobs = 5
[log]
level = "debug"
[[devices]]
name = "cpu"
meter = "modelled"
idle_watts = 3.5
watts_per_busy_core = 4
[jobs]
kill_grace_seconds = 0
keep_finished_days = 30
)",
                             "jouled.toml");
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->config.keep_finished_days, 30);
  EXPECT_EQ(loaded->config.server.host, "::1");
  EXPECT_EQ(loaded->config.server.port, 9000);
  EXPECT_EQ(loaded->config.server.max_queued_jobs, 5u);
  EXPECT_EQ(loaded->config.log_level, "debug");
  EXPECT_DOUBLE_EQ(loaded->config.devices[0].idle_watts, 3.5);
  EXPECT_DOUBLE_EQ(loaded->config.devices[0].watts_per_busy_core, 4.0);
  EXPECT_DOUBLE_EQ(loaded->config.kill_grace_seconds, 0.0);
}

TEST(DaemonConfigTest, every_problem_is_reported_with_file_and_line) {
  auto loaded = parse_config(R"([server]
listen = "127.0.0.1"
max_queued_jobs = -3
[log]
level = "loud"
[auth]
token_sha256 = ["my-secret-token"]
[jobs]
keep_finished_days = -1
)",
                             "jouled.toml");
  ASSERT_FALSE(loaded);
  const std::string& message = loaded.error().message;
  EXPECT_NE(message.find("jouled.toml:9: jobs.keep_finished_days"), std::string::npos) << message;
  EXPECT_NE(message.find("jouled.toml:2: server.listen"), std::string::npos) << message;
  EXPECT_NE(message.find("jouled.toml:3: server.max_queued_jobs"), std::string::npos) << message;
  EXPECT_NE(message.find("jouled.toml:5: log.level"), std::string::npos) << message;
  EXPECT_NE(message.find("jouled.toml:7: auth.token_sha256"), std::string::npos) << message;
}

TEST(DaemonConfigTest, syntax_errors_name_the_line) {
  auto loaded = parse_config("[server]\nlisten = \n", "bad.toml");
  ASSERT_FALSE(loaded);
  EXPECT_EQ(loaded.error().message.rfind("bad.toml:2:", 0), 0u) << loaded.error().message;
}

TEST(DaemonConfigTest, unknown_keys_are_warnings_with_lines) {
  auto loaded = parse_config("[server]\nlisten = \"127.0.0.1:1\"\nlisen = \"x\"\n[extra]\n", "jouled.toml");
  ASSERT_TRUE(loaded) << loaded.error().message;
  ASSERT_EQ(loaded->warnings.size(), 2u);
  EXPECT_EQ(loaded->warnings[0].describe(), "jouled.toml:3: unknown key server.lisen (ignored)");
  EXPECT_EQ(loaded->warnings[1].line, 4);
}

TEST(DaemonConfigTest, devices_are_cpu_cuda_or_simulated_and_meters_are_known_sources) {
  auto gpu = parse_config("[[devices]]\nname = \"cuda:0\"\nmeter = \"nvml\"\n[[devices]]\nname = \"cpu\"\n",
                          "jouled.toml");
  ASSERT_TRUE(gpu) << gpu.error().message;
  EXPECT_EQ(gpu->config.devices[0].name, "cuda:0");
  EXPECT_EQ(gpu->config.devices[0].meter, "nvml");
  auto bad = parse_config("[[devices]]\nname = \"tpu:0\"\n[[devices]]\nname = \"cuda:1\"\nmeter = \"modelled\"\n"
                          "[[devices]]\nname = \"cpu\"\nmeter = \"wattmeter\"\n",
                          "jouled.toml");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("jouled.toml:1: device \"tpu:0\""), std::string::npos) << bad.error().message;
  EXPECT_NE(bad.error().message.find("jouled.toml:5: device \"cuda:1\": the modelled meter models a CPU only"),
            std::string::npos)
      << bad.error().message;
  EXPECT_NE(bad.error().message.find("jouled.toml:8: devices.meter must be one of"), std::string::npos);
}

TEST(DaemonConfigTest, probing_settings_are_read_and_checked) {
  auto loaded = parse_config(
      "[probing]\nenabled = false\nhours = \"22:00-06:30\"\nmax_joules_per_day = 5000\nthreads = 2\n", "jouled.toml");
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_FALSE(loaded->config.probing.enabled);
  EXPECT_EQ(loaded->config.probing.start_minute, 22 * 60);
  EXPECT_EQ(loaded->config.probing.end_minute, 6 * 60 + 30);
  EXPECT_DOUBLE_EQ(loaded->config.probing.max_joules_per_day, 5000.0);
  EXPECT_EQ(loaded->config.probing.threads, 2);
  auto bad = parse_config("[probing]\nenabled = \"yes\"\nhours = \"25:00-26:00\"\nthreads = 0\n", "jouled.toml");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("jouled.toml:2: probing.enabled must be true or false"), std::string::npos);
  EXPECT_NE(bad.error().message.find("jouled.toml:3: probing.hours must look like"), std::string::npos);
  EXPECT_NE(bad.error().message.find("jouled.toml:4: probing.threads must be between 1 and 1024"), std::string::npos);
  // The interpreter the runtime probe measures: python3 from PATH unless named; "" measures none.
  EXPECT_EQ(loaded->config.probing.python, "python3");
  auto venv = parse_config("[probing]\npython = \"/srv/venv/bin/python\"\n", "jouled.toml");
  ASSERT_TRUE(venv) << venv.error().message;
  EXPECT_EQ(venv->config.probing.python, "/srv/venv/bin/python");
  auto none = parse_config("[probing]\npython = \"\"\n", "jouled.toml");
  ASSERT_TRUE(none) << none.error().message;
  EXPECT_EQ(none->config.probing.python, "");
  auto number = parse_config("[probing]\npython = 3\n", "jouled.toml");
  ASSERT_FALSE(number);
  EXPECT_NE(number.error().message.find("jouled.toml:2: probing.python"), std::string::npos) << number.error().message;
}

TEST(DaemonConfigTest, listen_addresses_and_loopback) {
  using joule::config::is_loopback_host;
  using joule::config::parse_listen_address;
  EXPECT_EQ(parse_listen_address("localhost:80")->first, "127.0.0.1");
  EXPECT_EQ(parse_listen_address("0.0.0.0:0")->second, 0);
  EXPECT_FALSE(parse_listen_address("127.0.0.1:70000"));
  EXPECT_FALSE(parse_listen_address("example.com:80"));
  EXPECT_FALSE(parse_listen_address(":80"));
  EXPECT_TRUE(is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(is_loopback_host("127.8.9.10"));
  EXPECT_TRUE(is_loopback_host("::1"));
  EXPECT_FALSE(is_loopback_host("0.0.0.0"));
  EXPECT_FALSE(is_loopback_host("192.0.2.1"));
}

TEST(DaemonConfigTest, simulated_devices_name_a_known_profile) {
  auto loaded = parse_config("[[devices]]\nname = \"cpu\"\n[[devices]]\nname = \"sim:jetson-orin\"\nprobes = 50\n",
                             "jouled.toml");
  ASSERT_TRUE(loaded) << loaded.error().message;
  ASSERT_EQ(loaded->config.devices.size(), 2u);
  EXPECT_EQ(loaded->config.devices[1].meter, "simulated");
  EXPECT_EQ(loaded->config.devices[1].probes, 50u);
  auto unknown = parse_config("[[devices]]\nname = \"sim:cray-1\"\n", "jouled.toml");
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().message.find("jouled.toml:1:"), std::string::npos) << unknown.error().message;
  EXPECT_NE(unknown.error().message.find("jetson-orin"), std::string::npos);  // the known names are listed
}

TEST(DaemonConfigTest, a_device_runs_probes_and_jobs_at_its_own_thread_count_or_the_probing_one) {
  auto loaded = parse_config(
      "[probing]\nthreads = 2\n[[devices]]\nname = \"cpu\"\nthreads = 4\n"
      "[[devices]]\nname = \"cuda:0\"\n",
      "jouled.toml");
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(device_threads(loaded->config.devices[0], loaded->config.probing), 4);
  EXPECT_EQ(device_threads(loaded->config.devices[1], loaded->config.probing), 2);
  EXPECT_EQ(to_json(loaded->config)["devices"][1]["threads"], 2);
  auto defaults = parse_config("", "jouled.toml");
  ASSERT_TRUE(defaults);
  EXPECT_EQ(device_threads(defaults->config.devices[0], defaults->config.probing), 1);
  auto zero = parse_config("[[devices]]\nname = \"cpu\"\nthreads = 0\n", "jouled.toml");
  ASSERT_FALSE(zero);
  EXPECT_NE(zero.error().message.find("jouled.toml:3:"), std::string::npos) << zero.error().message;
  EXPECT_NE(zero.error().message.find("devices.threads must be between 1 and 1024, got 0"), std::string::npos);
}

TEST(DaemonConfigTest, the_cpu_frequency_knob_reads_cpufreq_where_told_or_is_off) {
  auto defaults = parse_config("", "jouled.toml");
  ASSERT_TRUE(defaults);
  EXPECT_EQ(defaults->config.devices[0].cpufreq, "/sys/devices/system/cpu/cpufreq");
  auto moved = parse_config("[[devices]]\nname = \"cpu\"\ncpufreq = \"/host/sys/cpufreq\"\n", "jouled.toml");
  ASSERT_TRUE(moved) << moved.error().message;
  EXPECT_EQ(moved->config.devices[0].cpufreq, "/host/sys/cpufreq");
  auto off = parse_config("[[devices]]\nname = \"cpu\"\ncpufreq = \"off\"\n", "jouled.toml");
  ASSERT_TRUE(off) << off.error().message;
  EXPECT_TRUE(off->config.devices[0].cpufreq.empty());
  EXPECT_EQ(to_json(off->config)["devices"][0]["cpufreq"], "off");
  auto relative = parse_config("[[devices]]\nname = \"cpu\"\ncpufreq = \"sys/cpufreq\"\n", "jouled.toml");
  ASSERT_FALSE(relative);
  EXPECT_NE(relative.error().message.find("jouled.toml:3:"), std::string::npos) << relative.error().message;
  EXPECT_NE(relative.error().message.find("devices.cpufreq must be an absolute directory"), std::string::npos);
  auto devfreq = parse_config("[[devices]]\nname = \"cuda:0\"\ndevfreq = \"off\"\n", "jouled.toml");
  ASSERT_TRUE(devfreq) << devfreq.error().message;
  EXPECT_TRUE(devfreq->config.devices[0].devfreq.empty());
  EXPECT_EQ(to_json(devfreq->config)["devices"][0]["devfreq"], "off");
  EXPECT_FALSE(parse_config("[[devices]]\nname = \"cpu\"\ndevfreq = \"/sys/class/devfreq\"\n", "jouled.toml"));
  auto gpu = parse_config("[[devices]]\nname = \"cuda:0\"\ncpufreq = \"/sys\"\n", "jouled.toml");
  ASSERT_FALSE(gpu);
  EXPECT_NE(gpu.error().message.find("cpufreq is the CPU's knob"), std::string::npos) << gpu.error().message;
}

TEST(DaemonConfigTest, a_jetsons_power_modes_come_from_nvpmodel_unless_off) {
  auto defaults = parse_config("", "jouled.toml");
  ASSERT_TRUE(defaults);
  EXPECT_EQ(defaults->config.nvpmodel, "/usr/sbin/nvpmodel");
  EXPECT_EQ(defaults->config.nvpmodel_conf, "/etc/nvpmodel.conf");
  auto off = parse_config("[node]\nnvpmodel = \"off\"\n", "jouled.toml");
  ASSERT_TRUE(off) << off.error().message;
  EXPECT_TRUE(off->config.nvpmodel.empty());
  EXPECT_EQ(to_json(off->config)["node"]["nvpmodel"], "off");
  auto relative = parse_config("[node]\nnvpmodel = \"nvpmodel\"\n", "jouled.toml");
  ASSERT_FALSE(relative);
  EXPECT_NE(relative.error().message.find("jouled.toml:2:"), std::string::npos) << relative.error().message;
  EXPECT_NE(relative.error().message.find("node.nvpmodel must be an absolute path"), std::string::npos);
}

TEST(DaemonConfigTest, slurm_jobs_may_be_given_the_url_compute_nodes_reach_jouled_at) {
  const std::string type = "[[slurm.node_types]]\nname = \"cpu\"\nmodel = \"sim:laptop-cpu\"\n";
  auto loaded = parse_config("[slurm]\njoule_url = \"https://head.cluster:8571\"\n" + type, "jouled.toml");
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->config.slurm.joule_url, "https://head.cluster:8571");
  auto bad = parse_config("[slurm]\njoule_url = \"head:8571\"\n" + type, "jouled.toml");
  ASSERT_FALSE(bad);
  EXPECT_NE(
      bad.error().message.find("jouled.toml:2: slurm.joule_url \"head:8571\" must start with http:// or https://"),
      std::string::npos)
      << bad.error().message;
}

TEST(DaemonConfigTest, a_slurm_node_type_may_set_its_jobs_thread_count) {
  const std::string head = "[[slurm.node_types]]\nname = \"cpu\"\nmodel = \"sim:laptop-cpu\"\n";
  auto loaded = parse_config(head + "threads = 4\n", "jouled.toml");
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->config.slurm.node_types.at(0).threads, 4);
  auto unset = parse_config(head, "jouled.toml");
  ASSERT_TRUE(unset) << unset.error().message;
  EXPECT_EQ(unset->config.slurm.node_types.at(0).threads, 0);
  auto zero = parse_config(head + "threads = 0\n", "jouled.toml");
  ASSERT_FALSE(zero);
  EXPECT_NE(zero.error().message.find("jouled.toml:4:"), std::string::npos) << zero.error().message;
  EXPECT_NE(zero.error().message.find("slurm.node_types.threads must be between 1 and 4096, got 0"), std::string::npos)
      << zero.error().message;
}

TEST(DaemonConfigTest, cluster_roles_are_read_and_checked) {
  auto agent = parse_config(R"(
[cluster]
role = "agent"
coordinator = "https://coord.lab:8571"
token_file = "/etc/jouled/cluster.token"
ca_file = "/etc/jouled/ca.pem"
[[devices]]
name = "sim:jetson-orin"
runs_jobs = true
)",
                            "jouled.toml");
  ASSERT_TRUE(agent) << agent.error().message;
  EXPECT_EQ(agent->config.cluster.role, "agent");
  EXPECT_EQ(agent->config.cluster.coordinator, "https://coord.lab:8571");
  EXPECT_EQ(agent->config.cluster.ca_file, "/etc/jouled/ca.pem");
  EXPECT_TRUE(agent->config.devices.at(0).runs_jobs);

  auto bad = parse_config(R"(
[cluster]
role = "leader"
coordinator = "coord:8571"
heartbeat_seconds = 5
lost_after_seconds = 6
agent_token_sha256 = ["secret"]
[server]
tls_certificate = "/etc/jouled/cert.pem"
[[devices]]
name = "cpu"
runs_jobs = false
)",
                          "jouled.toml");
  ASSERT_FALSE(bad);
  const std::string& message = bad.error().message;
  EXPECT_NE(message.find("jouled.toml:3: cluster.role must be standalone, coordinator or agent"), std::string::npos)
      << message;
  EXPECT_NE(message.find("jouled.toml:4: cluster.coordinator must be a URL"), std::string::npos) << message;
  EXPECT_NE(message.find("at least twice heartbeat_seconds"), std::string::npos) << message;
  EXPECT_NE(message.find("jouled.toml:7: cluster.agent_token_sha256 entries must be 64 hex digits"), std::string::npos)
      << message;
  EXPECT_NE(message.find("tls_certificate and server.tls_private_key go together"), std::string::npos) << message;
  EXPECT_NE(message.find("runs_jobs is for simulated devices"), std::string::npos) << message;

  auto orphan = parse_config("[cluster]\nrole = \"agent\"\n", "jouled.toml");
  ASSERT_FALSE(orphan);
  EXPECT_NE(orphan.error().message.find("an agent needs cluster.coordinator"), std::string::npos);
}

TEST(DaemonConfigTest, named_tokens_and_job_accounts_are_read_and_their_mistakes_named) {
  const std::string hash(64, 'A');
  auto loaded = parse_config("[auth]\nlocal_users = \"read\"\n[[auth.tokens]]\nname = \"alice\"\nsha256 = \"" + hash +
                                 "\"\nscopes = [\"submit\"]\n[jobs]\nrun_as = \"per-job\"\ngroups = [\"video\"]\n"
                                 "directory = \"/srv/jobs\"\n",
                             "jouled.toml");
  ASSERT_TRUE(loaded) << loaded.error().message;
  ASSERT_EQ(loaded->config.tokens.size(), 1u);
  EXPECT_EQ(loaded->config.tokens[0].name, "alice");
  EXPECT_EQ(loaded->config.tokens[0].sha256, std::string(64, 'a'));
  EXPECT_EQ(loaded->config.tokens[0].scopes, std::vector<std::string>{"submit"});
  EXPECT_EQ(loaded->config.local_users, "read");
  EXPECT_EQ(loaded->config.job_groups, std::vector<std::string>{"video"});
  EXPECT_EQ(loaded->config.job_work_directory, "/srv/jobs");

  auto bad = parse_config(
      "[auth]\nlocal_users = \"everyone\"\n[[auth.tokens]]\nname = \"bob\"\nsha256 = \"secret\"\n"
      "[[auth.tokens]]\nname = \"carol\"\nsha256 = \"" +
          hash + "\"\nscopes = [\"root\"]\n[jobs]\nrun_as = \"a b\"\ndirectory = \"relative\"\n",
      "jouled.toml");
  ASSERT_FALSE(bad);
  const std::string& message = bad.error().message;
  EXPECT_NE(message.find("jouled.toml:2: auth.local_users"), std::string::npos) << message;
  EXPECT_NE(message.find("auth.tokens[0].sha256 must be the token's SHA-256"), std::string::npos) << message;
  EXPECT_NE(message.find("jouled.toml:9: auth.tokens[1].scopes[0]"), std::string::npos) << message;
  EXPECT_NE(message.find("jouled.toml:11: jobs.run_as"), std::string::npos) << message;
  EXPECT_NE(message.find("jouled.toml:12: jobs.directory"), std::string::npos) << message;
}

TEST(DaemonConfigTest, carbon_takes_a_file_or_a_url_and_a_constant) {
  auto file = parse_config("[carbon]\nfile = \"/etc/joule/carbon.csv\"\nintensity = 250\nrefresh_seconds = 60\n",
                           "jouled.toml");
  ASSERT_TRUE(file) << file.error().message;
  EXPECT_EQ(file->config.carbon.file, "/etc/joule/carbon.csv");
  EXPECT_EQ(file->config.carbon.constant, 250.0);
  EXPECT_EQ(file->config.carbon.refresh_seconds, 60.0);
  auto url = parse_config("[carbon]\nurl = \"https://api.example.org/v1/forecast\"\ntoken_file = \"/etc/joule/wt\"\n",
                          "jouled.toml");
  ASSERT_TRUE(url) << url.error().message;
  EXPECT_EQ(url->config.carbon.url, "https://api.example.org/v1/forecast");
  EXPECT_FALSE(parse_config("", "jouled.toml")->config.carbon.configured());
}

TEST(DaemonConfigTest, price_takes_a_currency_and_a_file_a_url_or_a_constant) {
  auto file =
      parse_config("[price]\ncurrency = \"EUR\"\nfile = \"/etc/joule/price.json\"\nper_kwh = 0.25\n", "jouled.toml");
  ASSERT_TRUE(file) << file.error().message;
  EXPECT_EQ(file->config.price.currency, "EUR");
  EXPECT_EQ(file->config.price.file, "/etc/joule/price.json");
  EXPECT_EQ(file->config.price.constant, 0.25);
  EXPECT_FALSE(file->config.carbon.configured());
  const auto problem = [](const std::string& text) {
    auto loaded = parse_config(text, "jouled.toml");
    return loaded ? std::string("accepted") : loaded.error().message;
  };
  EXPECT_NE(problem("[price]\nper_kwh = 0.3\n").find("jouled.toml:1: [price] needs a currency"), std::string::npos);
  EXPECT_NE(problem("[price]\ncurrency = \"eur\"\nper_kwh = 0.3\n")
                .find("jouled.toml:2: price.currency must be a currency code of 3 capital letters"),
            std::string::npos);
  EXPECT_NE(problem("[price]\ncurrency = \"GBP\"\n").find("[price] needs a file, a url or a per_kwh price"),
            std::string::npos);
  EXPECT_NE(problem("[price]\ncurrency = \"GBP\"\nper_kwh = -1\n").find("jouled.toml:3: price.per_kwh must be"),
            std::string::npos);
  EXPECT_NE(problem("[price]\ncurrency = \"GBP\"\nfile = \"p.csv\"\n").find("price.file must be an absolute path"),
            std::string::npos);
}

TEST(DaemonConfigTest, a_carbon_section_that_cannot_work_names_the_line) {
  const auto problem = [](const std::string& text) {
    auto loaded = parse_config(text, "jouled.toml");
    return loaded ? std::string("accepted") : loaded.error().message;
  };
  EXPECT_NE(problem("[carbon]\n").find("jouled.toml:1: [carbon] needs a file, a url or an intensity"),
            std::string::npos);
  EXPECT_NE(problem("[carbon]\nfile = \"carbon.csv\"\n").find("jouled.toml:2: carbon.file must be an absolute path"),
            std::string::npos);
  EXPECT_NE(problem("[carbon]\nurl = \"ftp://x/\"\n").find("must start with http:// or https://"), std::string::npos);
  EXPECT_NE(problem("[carbon]\nfile = \"/a.csv\"\nurl = \"http://x/\"\n").find("a file or a url, not both"),
            std::string::npos);
  EXPECT_NE(problem("[carbon]\nintensity = -3\n").find("jouled.toml:2: carbon.intensity must be 0-5000"),
            std::string::npos);
  EXPECT_NE(problem("[carbon]\nfile = \"/a.csv\"\ntoken_file = \"/t\"\n").find("set a url"), std::string::npos);
  EXPECT_NE(problem("[carbon]\nurl = \"http://x/\"\ntoken_header = \"auth-token\"\n").find("set a token_file"),
            std::string::npos);
  EXPECT_NE(problem("[carbon]\nurl = \"http://x/\"\ntoken_file = \"/t\"\ntoken_header = \"a b\"\n")
                .find("must be a header name"),
            std::string::npos);
}

// A GPU's own joule-worker (one built against the node's PyTorch LibTorch with CUDA).
TEST(DaemonConfigTest, a_device_names_its_own_worker_by_an_absolute_path) {
  auto loaded =
      parse_config("[[devices]]\nname = \"cuda:0\"\nworker = \"/opt/joule/joule-worker-cuda\"\n", "jouled.toml");
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->config.devices[0].worker, "/opt/joule/joule-worker-cuda");
  EXPECT_EQ(to_json(loaded->config)["devices"][0]["worker"], "/opt/joule/joule-worker-cuda");
  auto relative = parse_config("[[devices]]\nname = \"cuda:0\"\nworker = \"joule-worker\"\n", "jouled.toml");
  ASSERT_FALSE(relative);
  EXPECT_NE(relative.error().message.find("jouled.toml:3:"), std::string::npos) << relative.error().message;
  EXPECT_NE(relative.error().message.find("devices.worker must be an absolute path"), std::string::npos)
      << relative.error().message;
  EXPECT_FALSE(parse_config("[[devices]]\nname = \"sim:jetson-orin\"\nworker = \"/x\"\n", "jouled.toml"));
}

TEST(DaemonConfigTest, the_cpu_names_its_board_and_the_file_may_set_its_own_modelled_figures) {
  auto loaded = parse_config("[[devices]]\nname = \"cpu\"\nboard = \"Raspberry Pi 4 Model B\"\n", "jouled.toml");
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->config.devices[0].board, "Raspberry Pi 4 Model B");
  EXPECT_FALSE(loaded->config.devices[0].modelled_figures_set);
  EXPECT_EQ(to_json(loaded->config)["devices"][0]["board"], "Raspberry Pi 4 Model B");

  auto own = parse_config("[[devices]]\nname = \"cpu\"\nwatts_per_busy_core = 2\n", "jouled.toml");
  ASSERT_TRUE(own) << own.error().message;
  EXPECT_TRUE(own->config.devices[0].modelled_figures_set);

  auto gpu = parse_config("[[devices]]\nname = \"cuda:0\"\nboard = \"Raspberry Pi 5\"\n", "jouled.toml");
  ASSERT_FALSE(gpu);
  EXPECT_NE(gpu.error().message.find("jouled.toml:3:"), std::string::npos) << gpu.error().message;
  EXPECT_NE(gpu.error().message.find("set it on \"cpu\""), std::string::npos) << gpu.error().message;
  EXPECT_FALSE(parse_config("[[devices]]\nname = \"cpu\"\nboard = \"\"\n", "jouled.toml"));
}
