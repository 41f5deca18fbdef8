//! The detach timer (`sandbox-detach-timeout-ms` on `Start`): a process with no attached
//! `Start`/`Connect` stream for that long is killed with its whole session; an attached one is
//! not; a reattach in time stops the timer.

use std::time::Duration;

use sandbox_envd::process::{self as ps, ProcessSelector};
use sandbox_transport::envd::CallOptions;

use crate::{BOTH, TestAgent, eventually, kill, pid_of, sh};

const HEADER: &str = "sandbox-detach-timeout-ms";

/// Whether `pid` exists and is not a zombie.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// The process group of `pid`.
fn pgid(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, rest) = stat.rsplit_once(')').unwrap();
    rest.split_whitespace().nth(2).unwrap().parse().unwrap()
}

/// A PTY shell whose background job runs in a process group of its own (job control on), as
/// in an interactive terminal; answers the shell's pid (from `start`) and the job's.
async fn start_shell(
    client: &sandbox_transport::envd::EnvdClient<sandbox_transport::GuardedConnector>,
    options: CallOptions,
) -> (
    sandbox_transport::envd::ServerStream<ps::StartResponse>,
    u32,
    u32,
) {
    let mut request = sh("set -m; sleep 300 & echo job=$!; sleep 300");
    request.pty = Some(ps::Pty {
        size: Some(ps::pty::Size { cols: 80, rows: 24 }),
    });
    let mut stream = client.start(&request, options).await.unwrap();
    let pid = pid_of(&mut stream).await;
    let mut text = String::new();
    let job = loop {
        if let ps::process_event::Event::Data(d) = crate::next_event(&mut stream).await
            && let Some(ps::process_event::data_event::Output::Pty(b)) = d.output
        {
            text.push_str(&String::from_utf8_lossy(&b));
        }
        if let Some(rest) = text.split("job=").nth(1)
            && let Some(line) = rest.split_once(['\r', '\n'])
        {
            break line.0.trim().parse::<u32>().unwrap();
        }
    };
    (stream, pid, job)
}

#[tokio::test]
async fn a_detached_process_is_killed_with_its_session_and_an_attached_one_is_not() {
    let agent = TestAgent::start().await;
    for http in BOTH {
        let client = agent.client(http);
        let options = CallOptions::new()
            .extension(HEADER, 600)
            .keepalive(Duration::from_secs(1));
        let (stream, pid, job) = start_shell(&client, options).await;
        assert_ne!(
            pgid(job),
            pgid(pid),
            "the job must be in a group of its own"
        );

        // Attached (the Start stream is open) for well past the timeout: nothing is killed.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert!(alive(pid) && alive(job), "killed while attached");

        // Detached, then reattached before the timeout: still nothing.
        drop(stream);
        let attached = client
            .connect(ProcessSelector::pid(pid), CallOptions::new())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(3000)).await;
        assert!(alive(pid) && alive(job), "killed while reattached");

        // The last stream goes: the shell and its job are killed soon after the timeout (the
        // agent notices at its next keepalive, a second at most here).
        drop(attached);
        eventually(Duration::from_secs(10), "the detached shell's end", || {
            !alive(pid) && !alive(job)
        })
        .await;
    }
}

#[tokio::test]
async fn without_the_header_a_detached_process_lives_and_bad_values_are_refused() {
    let agent = TestAgent::start().await;
    let client = agent.client(BOTH[0]);
    let (stream, pid, job) = start_shell(&client, CallOptions::new().extension(HEADER, 0)).await;
    drop(stream);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(alive(pid) && alive(job), "0 means no timer");
    kill(&client, pid).await;
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(job as i32).unwrap(),
        rustix::process::Signal::KILL,
    );

    // A value that is not milliseconds is refused before anything starts.
    let raw = crate::raw_client(BOTH[0]);
    let response = raw
        .request(crate::rpc_request(
            &agent.url(),
            "/process.Process/Start",
            "application/connect+json",
            &[(HEADER, "soon".to_owned())],
            crate::envelope(&sh("echo never")),
        ))
        .await
        .unwrap();
    let (messages, end) = crate::read_stream(response).await;
    assert!(messages.is_empty(), "{messages:?}");
    let error = end.error.unwrap();
    assert_eq!(error.code, sandbox_envd::Code::InvalidArgument);
    assert!(error.message.contains(HEADER), "{error:?}");
}
