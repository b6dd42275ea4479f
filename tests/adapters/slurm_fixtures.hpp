#pragma once
// Output of Slurm 22.05.8's own tools (Debian 12), captured from the single-host Slurm of
// scripts/slurm-up.sh with seven jobs in every state the adapter must read:
//   1 ok      COMPLETED, exit 0          joule:job-ok
//   2 fail    FAILED, exit 3             joule:job-fail
//   3 run     CANCELLED while running (scancel: signal 15)   joule:job-run
//   4 sus     SUSPENDED (scontrol suspend)                    joule:job-sus
//   5 held    PENDING JobHeldUser (sbatch --hold)             joule:job-held
//   6 cancel  CANCELLED while pending (no nodes)              joule:job-cancel
//   7 other   RUNNING, not Joule's: "somebody else's job"
// Times are from the VM's clock (2026). Text is verbatim, except that squeue's JSON is
// re-indented and, for every job but 3, cut down to the keys around those the parser reads.

namespace joule::testing::slurm_fixtures {

/// SLURM_TIME_FORMAT=%s scontrol show job --oneliner
inline constexpr const char* kScontrolJobs = R"fx(JobId=1 JobName=ok UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 Account=(null) QOS=(null) JobState=COMPLETED Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:01 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=1795682768 EligibleTime=1795682768 AccrueTime=1795682768 StartTime=1795682771 EndTime=1795682772 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=1795682771 Scheduler=Main Partition=joule AllocNode:Sid=localhost:6512 ReqNodeList=(null) ExcNodeList=(null) NodeList=localhost BatchHost=localhost NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/fx Comment=joule:job-ok  StdErr=/tmp/fx/ok.out StdIn=/dev/null StdOut=/tmp/fx/ok.out Power= 
JobId=2 JobName=fail UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901758 Nice=0 Account=(null) QOS=(null) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=3:0 RunTime=00:00:02 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=1795682768 EligibleTime=1795682768 AccrueTime=1795682768 StartTime=1795682771 EndTime=1795682773 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=1795682771 Scheduler=Main Partition=joule AllocNode:Sid=localhost:6512 ReqNodeList=(null) ExcNodeList=(null) NodeList=localhost BatchHost=localhost NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/fx Comment=joule:job-fail  StdErr=/tmp/fx/fail.out StdIn=/dev/null StdOut=/tmp/fx/fail.out Power= 
JobId=3 JobName=run UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901757 Nice=0 Account=(null) QOS=(null) JobState=CANCELLED Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:15 RunTime=00:00:21 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=1795682768 EligibleTime=1795682768 AccrueTime=1795682768 StartTime=1795682773 EndTime=1795682794 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=1795682773 Scheduler=Main Partition=joule AllocNode:Sid=localhost:6512 ReqNodeList=(null) ExcNodeList=(null) NodeList=localhost BatchHost=localhost NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/fx Comment=joule:job-run  StdErr=/tmp/fx/run.out StdIn=/dev/null StdOut=/tmp/fx/run.out Power= 
JobId=4 JobName=sus UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=0 Nice=0 Account=(null) QOS=(null) JobState=SUSPENDED Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:17 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=1795682768 EligibleTime=1795682768 AccrueTime=1795682768 StartTime=1795682773 EndTime=Unknown Deadline=N/A SuspendTime=1795682790 SecsPreSuspend=17 LastSchedEval=1795682773 Scheduler=Main Partition=joule AllocNode:Sid=localhost:6512 ReqNodeList=(null) ExcNodeList=(null) NodeList=localhost BatchHost=localhost NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/fx Comment=joule:job-sus  StdErr=/tmp/fx/sus.out StdIn=/dev/null StdOut=/tmp/fx/sus.out Power= 
JobId=5 JobName=held UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=0 Nice=0 Account=(null) QOS=(null) JobState=PENDING Reason=JobHeldUser Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=1795682768 EligibleTime=Unknown AccrueTime=Unknown StartTime=Unknown EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=1795682768 Scheduler=Main Partition=joule AllocNode:Sid=localhost:6512 ReqNodeList=(null) ExcNodeList=(null) NodeList= NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=23849M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/fx Comment=joule:job-held  StdErr=/tmp/fx/held.out StdIn=/dev/null StdOut=/tmp/fx/held.out Power= 
JobId=6 JobName=cancel UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901755 Nice=0 Account=(null) QOS=(null) JobState=CANCELLED Reason=Resources Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=1795682769 EligibleTime=1795682769 AccrueTime=1795682769 StartTime=1795682790 EndTime=1795682790 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=1795682773 Scheduler=Main Partition=joule AllocNode:Sid=localhost:6512 ReqNodeList=(null) ExcNodeList=(null) NodeList= NumNodes=1 NumCPUs=1 NumTasks=N/A CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=23849M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/fx Comment=joule:job-cancel  StdErr=/tmp/fx/can.out StdIn=/dev/null StdOut=/tmp/fx/can.out Power= 
JobId=7 JobName=other UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901754 Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:05 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=1795682769 EligibleTime=1795682769 AccrueTime=1795682769 StartTime=1795682791 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=1795682791 Scheduler=Main Partition=joule AllocNode:Sid=localhost:6512 ReqNodeList=(null) ExcNodeList=(null) NodeList=localhost BatchHost=localhost NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/fx Comment=somebody else's job  StdErr=/tmp/fx/other.out StdIn=/dev/null StdOut=/tmp/fx/other.out Power= 
)fx";

/// scontrol show job --oneliner 1 with the default time format (ISO local time; the VM runs in UTC).
inline constexpr const char* kScontrolIsoJob = R"fx(JobId=1 JobName=ok UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 Account=(null) QOS=(null) JobState=COMPLETED Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:01 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-26T08:46:08 EligibleTime=2026-11-26T08:46:08 AccrueTime=2026-11-26T08:46:08 StartTime=2026-11-26T08:46:11 EndTime=2026-11-26T08:46:12 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-26T08:46:11 Scheduler=Main Partition=joule AllocNode:Sid=localhost:6512 ReqNodeList=(null) ExcNodeList=(null) NodeList=localhost BatchHost=localhost NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/fx Comment=joule:job-ok  StdErr=/tmp/fx/ok.out StdIn=/dev/null StdOut=/tmp/fx/ok.out Power= 
)fx";

/// squeue --json (data format v0.0.38)
inline constexpr const char* kSqueueJson = R"fx({
  "meta": {
    "plugin": {
      "type": "openapi/v0.0.38",
      "name": "Slurm OpenAPI v0.0.38"
    },
    "Slurm": {
      "version": {
        "major": 22,
        "micro": 8,
        "minor": 5
      },
      "release": "22.05.8"
    }
  },
  "errors": [],
  "jobs": [
    {
      "job_id": 1,
      "name": "ok",
      "comment": "joule:job-ok",
      "job_state": "COMPLETED",
      "state_reason": "None",
      "nodes": "localhost",
      "exit_code": 0,
      "derived_exit_code": 0,
      "start_time": 1795682771,
      "end_time": 1795682772,
      "submit_time": 1795682768,
      "suspend_time": 0,
      "partition": "joule",
      "user_name": "root"
    },
    {
      "job_id": 2,
      "name": "fail",
      "comment": "joule:job-fail",
      "job_state": "FAILED",
      "state_reason": "NonZeroExitCode",
      "nodes": "localhost",
      "exit_code": 768,
      "derived_exit_code": 0,
      "start_time": 1795682771,
      "end_time": 1795682773,
      "submit_time": 1795682768,
      "suspend_time": 0,
      "partition": "joule",
      "user_name": "root"
    },
    {
      "account": "",
      "accrue_time": 1795682768,
      "admin_comment": "",
      "array_job_id": 0,
      "array_task_id": null,
      "array_max_tasks": 0,
      "array_task_string": "",
      "association_id": 0,
      "batch_features": "",
      "batch_flag": true,
      "batch_host": "localhost",
      "flags": [
        "TRES_STR_CALC"
      ],
      "burst_buffer": "",
      "burst_buffer_state": "",
      "cluster": "joule",
      "cluster_features": "",
      "command": "",
      "comment": "joule:job-run",
      "container": "",
      "contiguous": false,
      "core_spec": null,
      "thread_spec": null,
      "cores_per_socket": null,
      "billable_tres": 1.0,
      "cpus_per_task": null,
      "cpu_frequency_minimum": null,
      "cpu_frequency_maximum": null,
      "cpu_frequency_governor": null,
      "cpus_per_tres": "",
      "deadline": 0,
      "delay_boot": 0,
      "dependency": "",
      "derived_exit_code": 0,
      "eligible_time": 1795682768,
      "end_time": 1795682794,
      "excluded_nodes": "",
      "exit_code": 15,
      "features": "",
      "federation_origin": "",
      "federation_siblings_active": "",
      "federation_siblings_viable": "",
      "gres_detail": [],
      "group_id": 0,
      "group_name": "root",
      "job_id": 3,
      "job_resources": {
        "nodes": "localhost",
        "allocated_cores": 1,
        "allocated_hosts": 1,
        "allocated_nodes": [
          {
            "sockets": {
              "0": {
                "cores": {
                  "0": "allocated"
                }
              }
            },
            "nodename": "localhost",
            "cpus_used": 0,
            "memory_used": 0,
            "memory_allocated": 0
          }
        ]
      },
      "job_state": "CANCELLED",
      "last_sched_evaluation": 1795682773,
      "licenses": "",
      "max_cpus": 0,
      "max_nodes": 0,
      "mcs_label": "",
      "memory_per_tres": "",
      "name": "run",
      "nodes": "localhost",
      "nice": null,
      "tasks_per_core": null,
      "tasks_per_node": 0,
      "tasks_per_socket": null,
      "tasks_per_board": 0,
      "cpus": 1,
      "node_count": 1,
      "tasks": 1,
      "het_job_id": 0,
      "het_job_id_set": "",
      "het_job_offset": 0,
      "partition": "joule",
      "prefer": "",
      "memory_per_node": null,
      "memory_per_cpu": null,
      "minimum_cpus_per_node": 1,
      "minimum_tmp_disk_per_node": 0,
      "preempt_time": 0,
      "pre_sus_time": 0,
      "priority": 4294901757,
      "profile": null,
      "qos": "",
      "reboot": false,
      "required_nodes": "",
      "requeue": true,
      "resize_time": 0,
      "restart_cnt": 0,
      "resv_name": "",
      "shared": null,
      "show_flags": [
        "SHOW_ALL",
        "SHOW_DETAIL",
        "SHOW_LOCAL"
      ],
      "sockets_per_board": 0,
      "sockets_per_node": null,
      "start_time": 1795682773,
      "state_description": "",
      "state_reason": "None",
      "standard_error": "",
      "standard_input": "/dev/null",
      "standard_output": "/tmp/fx/run.out",
      "submit_time": 1795682768,
      "suspend_time": 0,
      "system_comment": "",
      "time_limit": null,
      "time_minimum": 0,
      "threads_per_core": null,
      "tres_bind": "",
      "tres_freq": "",
      "tres_per_job": "",
      "tres_per_node": "",
      "tres_per_socket": "",
      "tres_per_task": "",
      "tres_req_str": "cpu=1,mem=23849M,node=1,billing=1",
      "tres_alloc_str": "cpu=1,node=1,billing=1",
      "user_id": 0,
      "user_name": "root",
      "wckey": "",
      "current_working_directory": "/tmp/fx"
    },
    {
      "job_id": 4,
      "name": "sus",
      "comment": "joule:job-sus",
      "job_state": "SUSPENDED",
      "state_reason": "None",
      "nodes": "localhost",
      "exit_code": 0,
      "derived_exit_code": 0,
      "start_time": 1795682773,
      "end_time": 1827218773,
      "submit_time": 1795682768,
      "suspend_time": 1795682790,
      "partition": "joule",
      "user_name": "root"
    },
    {
      "job_id": 5,
      "name": "held",
      "comment": "joule:job-held",
      "job_state": "PENDING",
      "state_reason": "JobHeldUser",
      "nodes": "",
      "exit_code": 0,
      "derived_exit_code": 0,
      "start_time": 0,
      "end_time": 0,
      "submit_time": 1795682768,
      "suspend_time": 0,
      "partition": "joule",
      "user_name": "root"
    },
    {
      "job_id": 6,
      "name": "cancel",
      "comment": "joule:job-cancel",
      "job_state": "CANCELLED",
      "state_reason": "Resources",
      "nodes": "",
      "exit_code": 0,
      "derived_exit_code": 0,
      "start_time": 1795682790,
      "end_time": 1795682790,
      "submit_time": 1795682769,
      "suspend_time": 0,
      "partition": "joule",
      "user_name": "root"
    },
    {
      "job_id": 7,
      "name": "other",
      "comment": "somebody else's job",
      "job_state": "RUNNING",
      "state_reason": "None",
      "nodes": "localhost",
      "exit_code": 0,
      "derived_exit_code": 0,
      "start_time": 1795682791,
      "end_time": 1827218791,
      "submit_time": 1795682769,
      "suspend_time": 0,
      "partition": "joule",
      "user_name": "root"
    }
  ]
}
)fx";

/// squeue --json with slurmctld killed: exit 0 after 9 s, and this on stdout.
inline constexpr const char* kSqueueJsonControllerDown = R"fx({
  "meta": {
    "plugin": {
      "type": "openapi\/v0.0.38",
      "name": "Slurm OpenAPI v0.0.38"
    },
    "Slurm": {
      "version": {
        "major": 22,
        "micro": 8,
        "minor": 5
      },
      "release": "22.05.8"
    }
  },
  "errors": [
    {
      "description": "Failed while looking for jobs",
      "error_number": -1,
      "error": "Unspecified error",
      "source": "slurm_load_jobs"
    }
  ],
  "jobs": [
  ]
}
)fx";

}  // namespace joule::testing::slurm_fixtures
