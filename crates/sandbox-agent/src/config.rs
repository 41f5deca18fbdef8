//! The agent's start flags: where it listens, who it runs processes as, and every limit.
//!
//! Parsed by hand (no CLI framework, to keep the static binary small). Every flag has a named
//! default below; `--help` prints them. The access token can come from a flag, a file or the
//! environment, so it need not show in `ps`.

use std::ffi::OsString;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::users::AccountFiles;

/// envd's port; the SDKs dial it.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:49983";
/// The user processes run as when a request names none. Every image has root; images built
/// for the SDKs pass `--default-user user`.
pub const DEFAULT_USER: &str = "root";
/// The environment variable the access token may be read from.
pub const ACCESS_TOKEN_ENV: &str = "SANDBOX_AGENT_ACCESS_TOKEN";
/// Live processes at once; one more Start is `resource_exhausted`.
pub const DEFAULT_MAX_PROCESSES: usize = 256;
/// Recent output each process keeps for re-attaching clients (bytes, all streams together).
pub const DEFAULT_OUTPUT_RING_BYTES: usize = 1024 * 1024;
/// The smallest output ring accepted: one full pipe chunk must fit.
pub const MIN_OUTPUT_RING_BYTES: usize = 32 * 1024;
/// Input accepted for a process but not yet taken by it (bytes); more is `resource_exhausted`.
pub const DEFAULT_STDIN_BUFFER_BYTES: usize = 1024 * 1024;
/// The largest request head: the HTTP/1.1 read buffer and the HTTP/2 header list.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;
/// The HTTP/1.1 read buffer cannot be smaller than this (hyper's minimum).
pub const MIN_HEADER_BYTES: usize = 8 * 1024;
/// Concurrent HTTP/2 streams per connection.
pub const DEFAULT_H2_MAX_STREAMS: u32 = 256;
/// The largest Connect message (unary body or one envelope), as our envd client's limit.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = sandbox_envd::envelope::DEFAULT_MAX_MESSAGE_SIZE;
/// Open tunnels (`/sandbox-agent/tunnel/`) at once; one more is 429 `resource_exhausted`.
pub const DEFAULT_MAX_TUNNELS: usize = 64;
/// How long SIGTERM'd process groups get before SIGKILL when the agent itself is stopped.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// The agent's log file is rotated (once, to `<file>.1`) past this size.
pub const DEFAULT_LOG_MAX_BYTES: u64 = 8 * 1024 * 1024;
/// The activity marker is touched at most this often, however many requests arrive.
pub const ACTIVITY_TOUCH_INTERVAL: Duration = Duration::from_secs(1);

/// Everything the agent is started with.
#[derive(Clone)]
pub struct Config {
    pub listen: SocketAddr,
    /// Whether the TCP listener runs. Off when `--listen-unix` is given without `--listen`:
    /// a sandbox reached only through its socket (a container in network `none`) needs none.
    pub listen_tcp: bool,
    /// A unix socket to serve on too (created mode 0600; a stale socket file is replaced).
    pub listen_unix: Option<PathBuf>,
    /// A file whose mtime the agent sets on every request it serves (at most once per
    /// [`ACTIVITY_TOUCH_INTERVAL`]), so an idle sweep reading it sees the agent's use.
    pub activity_marker: Option<PathBuf>,
    /// Trees the file endpoints and the filesystem service refuse, judged where a path
    /// resolves (`--reserved-path`, repeatable; see [`crate::fs::reserved`]).
    pub reserved_paths: Vec<PathBuf>,
    pub default_user: String,
    /// Where processes start when a request names no `cwd` (default: the user's home).
    pub default_workdir: Option<PathBuf>,
    pub access_token: Option<String>,
    /// `KEY=VALUE` pairs every process gets before its request's own `envs`.
    pub default_env: Vec<(String, String)>,
    pub accounts: AccountFiles,
    pub max_processes: usize,
    pub output_ring_bytes: usize,
    pub stdin_buffer_bytes: usize,
    pub max_header_bytes: usize,
    pub h2_max_streams: u32,
    pub max_message_bytes: usize,
    pub max_tunnels: usize,
    pub shutdown_grace: Duration,
    pub log_file: Option<PathBuf>,
    pub log_max_bytes: u64,
    /// Where the agent logs (stderr, or `log_file` once the binary opened it).
    pub log: crate::log::Log,
    /// Whether exited children the agent did not start (orphans it adopted) are reaped. Only
    /// a test turns this off, to show that zombies then remain.
    pub reap_orphans: bool,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is a secret: say only whether there is one.
        f.debug_struct("Config")
            .field("listen", &self.listen)
            .field("listen_tcp", &self.listen_tcp)
            .field("listen_unix", &self.listen_unix)
            .field("activity_marker", &self.activity_marker)
            .field("reserved_paths", &self.reserved_paths)
            .field("default_user", &self.default_user)
            .field("default_workdir", &self.default_workdir)
            .field("access_token", &self.access_token.as_ref().map(|_| "<set>"))
            .field("default_env", &self.default_env.len())
            .field("accounts", &self.accounts)
            .field("max_processes", &self.max_processes)
            .field("output_ring_bytes", &self.output_ring_bytes)
            .field("stdin_buffer_bytes", &self.stdin_buffer_bytes)
            .field("max_header_bytes", &self.max_header_bytes)
            .field("h2_max_streams", &self.h2_max_streams)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("max_tunnels", &self.max_tunnels)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("log_file", &self.log_file)
            .field("log_max_bytes", &self.log_max_bytes)
            .field("reap_orphans", &self.reap_orphans)
            .finish()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([0, 0, 0, 0], 49983)),
            listen_tcp: true,
            listen_unix: None,
            activity_marker: None,
            reserved_paths: Vec::new(),
            default_user: DEFAULT_USER.to_owned(),
            default_workdir: None,
            access_token: None,
            default_env: Vec::new(),
            accounts: AccountFiles::default(),
            max_processes: DEFAULT_MAX_PROCESSES,
            output_ring_bytes: DEFAULT_OUTPUT_RING_BYTES,
            stdin_buffer_bytes: DEFAULT_STDIN_BUFFER_BYTES,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            h2_max_streams: DEFAULT_H2_MAX_STREAMS,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_tunnels: DEFAULT_MAX_TUNNELS,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            log_file: None,
            log_max_bytes: DEFAULT_LOG_MAX_BYTES,
            log: crate::log::Log::stderr(),
            reap_orphans: true,
        }
    }
}

/// What the command line asked for.
#[derive(Debug)]
pub enum Command {
    Run(Box<Config>),
    /// `sandbox-agent relay <socket>`: copy stdin to the socket and the socket to stdout
    /// (see [`crate::relay`]).
    Relay(PathBuf),
    Help,
    Version,
}

/// A flag that could not be taken; the binary prints it with the usage and exits 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// The usage text, with every default.
pub fn usage() -> String {
    format!(
        "usage: sandbox-agent [flags]\n\
         \x20      sandbox-agent relay SOCKET   (copy stdin to a unix socket, the socket to stdout)\n\
         \n\
         Serves envd's HTTP endpoints and Connect services (process, filesystem) inside a sandbox.\n\
         \n\
         flags (a value may follow as the next argument or after '='):\n\
         \x20 --listen ADDR               address to listen on (default {DEFAULT_LISTEN})\n\
         \x20 --listen-unix PATH          serve on a unix socket too (mode 0600); without --listen,\n\
         \x20                             only there\n\
         \x20 --activity-marker PATH      touch PATH's mtime on every request served (at most once a second)\n\
         \x20 --reserved-path PATH        refuse file operations on PATH and below, judged where a path\n\
         \x20                             resolves (repeatable; default: nothing reserved)\n\
         \x20 --default-user NAME         user for requests that name none (default {DEFAULT_USER})\n\
         \x20 --default-workdir PATH      cwd for processes that name none (default: the user's home)\n\
         \x20 --access-token TOKEN        require X-Access-Token (visible in ps: prefer the two below)\n\
         \x20 --access-token-file PATH    read the token from a file (trailing newline dropped)\n\
         \x20                             (or set {ACCESS_TOKEN_ENV})\n\
         \x20 --env KEY=VALUE             default environment of every process (repeatable)\n\
         \x20 --passwd PATH, --group PATH account files (default /etc/passwd, /etc/group)\n\
         \x20 --max-processes N           live processes at once (default {DEFAULT_MAX_PROCESSES})\n\
         \x20 --output-ring-bytes N       recent output kept per process (default {DEFAULT_OUTPUT_RING_BYTES})\n\
         \x20 --stdin-buffer-bytes N      pending input per process (default {DEFAULT_STDIN_BUFFER_BYTES})\n\
         \x20 --max-header-bytes N        largest request head (default {DEFAULT_MAX_HEADER_BYTES})\n\
         \x20 --h2-max-streams N          concurrent HTTP/2 streams per connection (default {DEFAULT_H2_MAX_STREAMS})\n\
         \x20 --max-message-bytes N       largest Connect message (default {DEFAULT_MAX_MESSAGE_BYTES})\n\
         \x20 --max-tunnels N             open tunnels to sandbox ports at once (default {DEFAULT_MAX_TUNNELS})\n\
         \x20 --shutdown-grace-ms N       SIGTERM to SIGKILL on shutdown (default {})\n\
         \x20 --log-file PATH             log there (rotated once past --log-max-bytes) instead of stderr\n\
         \x20 --log-max-bytes N           (default {DEFAULT_LOG_MAX_BYTES})\n\
         \x20 --no-reap-orphans           test only: leave adopted orphans as zombies\n\
         \x20 --help, --version\n",
        DEFAULT_SHUTDOWN_GRACE.as_millis()
    )
}

/// Parses the arguments after the program name. `env` looks up an environment variable (the
/// binary passes `std::env::var_os`; tests pass a map).
pub fn parse(
    args: impl IntoIterator<Item = OsString>,
    env: impl Fn(&str) -> Option<OsString>,
) -> Result<Command, ConfigError> {
    let mut config = Config::default();
    let mut token_flag: Option<String> = None;
    let mut token_file: Option<PathBuf> = None;
    let mut tcp_named = false;
    let mut args = args.into_iter().peekable();
    if args.peek().is_some_and(|a| a == "relay") {
        args.next();
        let socket = args
            .next()
            .ok_or_else(|| ConfigError("relay needs the socket's path".into()))?;
        if let Some(extra) = args.next() {
            return Err(ConfigError(format!(
                "relay takes one argument, the socket's path; {extra:?} is one too many"
            )));
        }
        return Ok(Command::Relay(PathBuf::from(socket)));
    }
    while let Some(arg) = args.next() {
        let arg = arg
            .into_string()
            .map_err(|a| ConfigError(format!("argument {a:?} is not UTF-8")))?;
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        let mut value = || -> Result<String, ConfigError> {
            if let Some(v) = inline.clone() {
                return Ok(v);
            }
            args.next()
                .ok_or_else(|| ConfigError(format!("{name} needs a value")))?
                .into_string()
                .map_err(|a| ConfigError(format!("the value of {name}, {a:?}, is not UTF-8")))
        };
        match name.as_str() {
            "--help" | "-h" => return Ok(Command::Help),
            "--version" | "-V" => return Ok(Command::Version),
            "--listen" => {
                tcp_named = true;
                let v = value()?;
                // An IP address and a port only: the agent never resolves names.
                config.listen = v.parse().map_err(|_| {
                    ConfigError(format!(
                        "--listen {v:?}: expected IP:PORT, e.g. {DEFAULT_LISTEN}"
                    ))
                })?;
            }
            "--listen-unix" => {
                let v = PathBuf::from(value()?);
                if v.as_os_str().is_empty() {
                    return Err(ConfigError("--listen-unix needs a path".into()));
                }
                config.listen_unix = Some(v);
            }
            "--activity-marker" => {
                let v = PathBuf::from(value()?);
                if !v.is_absolute() {
                    return Err(ConfigError(format!(
                        "--activity-marker {}: must be absolute",
                        v.display()
                    )));
                }
                config.activity_marker = Some(v);
            }
            "--reserved-path" => {
                let v = PathBuf::from(value()?);
                if !v.is_absolute() {
                    return Err(ConfigError(format!(
                        "--reserved-path {}: must be absolute",
                        v.display()
                    )));
                }
                config.reserved_paths.push(v);
            }
            "--default-user" => {
                let v = value()?;
                if v.is_empty() || v.contains(':') {
                    return Err(ConfigError(format!(
                        "--default-user {v:?}: not a user name"
                    )));
                }
                config.default_user = v;
            }
            "--default-workdir" => {
                let v = PathBuf::from(value()?);
                if !v.is_absolute() {
                    return Err(ConfigError(format!(
                        "--default-workdir {}: must be absolute",
                        v.display()
                    )));
                }
                config.default_workdir = Some(v);
            }
            "--access-token" => token_flag = Some(value()?),
            "--access-token-file" => token_file = Some(PathBuf::from(value()?)),
            "--env" => {
                let v = value()?;
                match v.split_once('=') {
                    Some((k, val)) if !k.is_empty() => {
                        config.default_env.push((k.to_owned(), val.to_owned()));
                    }
                    _ => return Err(ConfigError(format!("--env {v:?}: expected KEY=VALUE"))),
                }
            }
            "--passwd" => config.accounts.passwd = PathBuf::from(value()?),
            "--group" => config.accounts.group = PathBuf::from(value()?),
            "--max-processes" => config.max_processes = number(&name, &value()?, 1)?,
            "--output-ring-bytes" => {
                config.output_ring_bytes = number(&name, &value()?, MIN_OUTPUT_RING_BYTES)?;
            }
            "--stdin-buffer-bytes" => config.stdin_buffer_bytes = number(&name, &value()?, 1)?,
            "--max-header-bytes" => {
                config.max_header_bytes = number(&name, &value()?, MIN_HEADER_BYTES)?;
            }
            "--h2-max-streams" => {
                let n: usize = number(&name, &value()?, 1)?;
                config.h2_max_streams =
                    u32::try_from(n).map_err(|_| ConfigError(format!("{name} {n}: too large")))?;
            }
            "--max-message-bytes" => {
                config.max_message_bytes = number(&name, &value()?, 1024)?;
            }
            "--max-tunnels" => config.max_tunnels = number(&name, &value()?, 1)?,
            "--shutdown-grace-ms" => {
                let ms: usize = number(&name, &value()?, 0)?;
                config.shutdown_grace = Duration::from_millis(ms as u64);
            }
            "--log-file" => config.log_file = Some(PathBuf::from(value()?)),
            "--log-max-bytes" => {
                config.log_max_bytes = number::<usize>(&name, &value()?, 4096)? as u64;
            }
            "--no-reap-orphans" => config.reap_orphans = false,
            other => return Err(ConfigError(format!("unknown argument {other:?}"))),
        }
    }
    config.access_token = match (token_flag, token_file) {
        (Some(_), Some(_)) => {
            return Err(ConfigError(
                "--access-token and --access-token-file exclude each other".into(),
            ));
        }
        (Some(t), None) => Some(t),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| ConfigError(format!("--access-token-file {}: {e}", path.display())))?;
            Some(text.trim_end_matches(['\n', '\r']).to_owned())
        }
        (None, None) => env(ACCESS_TOKEN_ENV)
            .map(|t| {
                t.into_string()
                    .map_err(|_| ConfigError(format!("{ACCESS_TOKEN_ENV} is not UTF-8")))
            })
            .transpose()?,
    };
    config.listen_tcp = tcp_named || config.listen_unix.is_none();
    // An empty token would accept an empty header: treat it as no token, as envd does.
    config.access_token = config.access_token.filter(|t| !t.is_empty());
    Ok(Command::Run(Box::new(config)))
}

fn number<T>(name: &str, text: &str, min: T) -> Result<T, ConfigError>
where
    T: std::str::FromStr + PartialOrd + fmt::Display + Copy,
{
    let n: T = text
        .parse()
        .map_err(|_| ConfigError(format!("{name} {text:?}: not a number")))?;
    if n < min {
        return Err(ConfigError(format!("{name} {n}: at least {min}")));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Config, ConfigError> {
        run_env(args, &[])
    }

    fn run_env(args: &[&str], env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        match parse(args.iter().map(OsString::from), |k| {
            env.iter().find(|(n, _)| n == k).map(|(_, v)| v.into())
        })? {
            Command::Run(c) => Ok(*c),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn defaults_are_the_named_constants() {
        let c = run(&[]).unwrap();
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(c.default_user, DEFAULT_USER);
        assert_eq!(c.access_token, None);
        assert_eq!(c.max_processes, DEFAULT_MAX_PROCESSES);
        assert_eq!(c.output_ring_bytes, DEFAULT_OUTPUT_RING_BYTES);
        assert_eq!(c.max_message_bytes, 4 * 1024 * 1024);
        assert_eq!(c.max_tunnels, DEFAULT_MAX_TUNNELS);
        assert_eq!(run(&["--max-tunnels=3"]).unwrap().max_tunnels, 3);
        assert!(run(&["--max-tunnels", "0"]).is_err());
        assert!(c.reap_orphans);
    }

    #[test]
    fn flags_take_values_both_ways() {
        let c = run(&[
            "--listen",
            "127.0.0.1:1",
            "--default-user=user",
            "--env",
            "A=b=c",
            "--env=EMPTY=",
            "--max-processes",
            "3",
            "--h2-max-streams=9",
            "--shutdown-grace-ms",
            "250",
            "--no-reap-orphans",
        ])
        .unwrap();
        assert_eq!(c.listen, "127.0.0.1:1".parse().unwrap());
        assert_eq!(c.default_user, "user");
        assert_eq!(
            c.default_env,
            vec![("A".into(), "b=c".into()), ("EMPTY".into(), String::new())]
        );
        assert_eq!(c.max_processes, 3);
        assert_eq!(c.h2_max_streams, 9);
        assert_eq!(c.shutdown_grace, Duration::from_millis(250));
        assert!(!c.reap_orphans);
    }

    #[test]
    fn the_token_comes_from_a_flag_a_file_or_the_environment() {
        assert_eq!(
            run(&["--access-token", "t1"])
                .unwrap()
                .access_token
                .as_deref(),
            Some("t1")
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "t2\n").unwrap();
        let c = run(&["--access-token-file", file.to_str().unwrap()]).unwrap();
        assert_eq!(c.access_token.as_deref(), Some("t2"));
        let c = run_env(&[], &[(ACCESS_TOKEN_ENV, "t3")]).unwrap();
        assert_eq!(c.access_token.as_deref(), Some("t3"));
        assert_eq!(
            run_env(&[], &[(ACCESS_TOKEN_ENV, "")])
                .unwrap()
                .access_token,
            None
        );
        assert!(!format!("{c:?}").contains("t3"));
        assert!(run(&["--access-token=a", "--access-token-file=/x"]).is_err());
    }

    #[test]
    fn a_unix_socket_replaces_tcp_unless_tcp_is_named() {
        let c = run(&[]).unwrap();
        assert!(c.listen_tcp);
        assert_eq!(c.listen_unix, None);
        let c = run(&["--listen-unix", "/.sandbox/agent.sock"]).unwrap();
        assert!(!c.listen_tcp);
        assert_eq!(c.listen_unix, Some(PathBuf::from("/.sandbox/agent.sock")));
        let c = run(&["--listen-unix=/s", "--listen", "127.0.0.1:1"]).unwrap();
        assert!(c.listen_tcp);
        let c = run(&["--activity-marker", "/var/lib/sandbox-activity"]).unwrap();
        assert_eq!(
            c.activity_marker,
            Some(PathBuf::from("/var/lib/sandbox-activity"))
        );
        assert!(run(&["--activity-marker", "rel"]).is_err());
    }

    #[test]
    fn reserved_paths_repeat_and_must_be_absolute() {
        assert!(run(&[]).unwrap().reserved_paths.is_empty());
        let c = run(&["--reserved-path", "/proc", "--reserved-path=/.sandbox"]).unwrap();
        assert_eq!(
            c.reserved_paths,
            vec![PathBuf::from("/proc"), PathBuf::from("/.sandbox")]
        );
        let e = run(&["--reserved-path", "proc"]).unwrap_err().to_string();
        assert!(e.contains("must be absolute"), "{e}");
        assert!(usage().contains("--reserved-path"));
    }

    #[test]
    fn relay_takes_exactly_the_socket() {
        let parse_args = |args: &[&str]| parse(args.iter().map(OsString::from), |_| None);
        assert!(matches!(
            parse_args(&["relay", "/.sandbox/agent.sock"]),
            Ok(Command::Relay(p)) if p == std::path::Path::new("/.sandbox/agent.sock")
        ));
        let e = parse_args(&["relay"]).unwrap_err().to_string();
        assert!(e.contains("socket"), "{e}");
        let e = parse_args(&["relay", "/a", "/b"]).unwrap_err().to_string();
        assert!(e.contains("one too many"), "{e}");
    }

    #[test]
    fn bad_flags_say_what_is_wrong() {
        let check = |args: &[&str], needle: &str| {
            let e = run(args).unwrap_err().to_string();
            assert!(e.contains(needle), "{args:?}: {e}");
        };
        check(&["--listen", "localhost:1"], "expected IP:PORT");
        check(&["--listen"], "needs a value");
        check(&["--max-processes", "0"], "at least 1");
        check(&["--max-processes", "x"], "not a number");
        check(&["--output-ring-bytes", "100"], "at least 32768");
        check(&["--default-workdir", "rel"], "must be absolute");
        check(&["--env", "=v"], "KEY=VALUE");
        check(&["--default-user", "a:b"], "not a user name");
        check(&["--bogus"], "unknown argument");
        check(
            &["--access-token-file", "/nonexistent/token"],
            "--access-token-file",
        );
        assert!(matches!(
            parse([OsString::from("--help")], |_| None),
            Ok(Command::Help)
        ));
        assert!(usage().contains(DEFAULT_LISTEN));
    }
}
