//! `sandbox`: the service and its command line.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use sandbox_app::client::{self, Client, ClientError};
use sandbox_app::config::ServiceConfig;

#[derive(Parser, Debug)]
#[command(
    name = "sandbox",
    version,
    about = "Persistent, isolated sandboxes for AI-agent sessions"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the service (config file, then SANDBOX_* environment overrides).
    Serve {
        /// A TOML config file.
        #[arg(long, env = "SANDBOX_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Check the backend and the store, explain each fix; non-zero exit when something is wrong.
    Doctor {
        /// A TOML config file.
        #[arg(long, env = "SANDBOX_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Run a command in a session's sandbox; output streams as it is produced and the exit
    /// status is the command's (124 when killed at its timeout).
    Exec(ExecArgs),
    /// Download, upload and list files of a session's sandbox.
    #[command(subcommand)]
    Files(FilesCommand),
    /// An interactive shell in a session's sandbox, in this terminal (raw mode, resizes follow).
    Shell {
        #[command(flatten)]
        conn: Conn,
        /// The session.
        session: String,
        /// Reattach to this running terminal (the pid `sandbox shell` printed when it opened
        /// it) instead of opening a new one.
        #[arg(long)]
        pid: Option<u32>,
    },
    /// List a session's background processes (started with `sandbox exec --background`).
    Ps {
        #[command(flatten)]
        conn: Conn,
        /// Print the service's JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// The session.
        session: String,
    },
    /// Follow a background process's output; exits with its status (128 + N when signal N
    /// ended it).
    Attach {
        #[command(flatten)]
        conn: Conn,
        /// Replay from this output offset (0: everything still kept); default: live output only.
        #[arg(long, value_name = "OFFSET")]
        from: Option<u64>,
        /// The session.
        session: String,
        /// The process: its pid or its tag.
        process: String,
    },
    /// Send a signal to a background process.
    Kill {
        #[command(flatten)]
        conn: Conn,
        /// HUP, INT, QUIT, KILL, USR1, USR2 or TERM.
        #[arg(short, long, default_value = "TERM")]
        signal: String,
        /// The session.
        session: String,
        /// The process: its pid or its tag.
        process: String,
    },
    /// Print changes below a directory of a session's sandbox as they happen (`create PATH`).
    Watch {
        #[command(flatten)]
        conn: Conn,
        /// Report changes deeper than the directory's own entries too.
        #[arg(short, long)]
        recursive: bool,
        /// Print the service's JSON lines instead.
        #[arg(long)]
        json: bool,
        /// The session.
        session: String,
        /// Absolute path inside the sandbox.
        #[arg(default_value = "/workspace")]
        path: String,
    },
}

/// How a client command reaches the service. The token is read from `SANDBOX_TOKEN` or a file,
/// never taken as an argument (arguments are visible to every user in the process list).
#[derive(Args, Debug)]
struct Conn {
    /// The service's base URL.
    #[arg(long, env = "SANDBOX_SERVER", default_value = "http://127.0.0.1:8080")]
    server: String,
    /// A file holding the API token (default: the development token file `sandbox serve`
    /// creates). `SANDBOX_TOKEN` takes precedence.
    #[arg(long, env = "SANDBOX_TOKEN_FILE")]
    token_file: Option<PathBuf>,
}

impl Conn {
    fn client(&self) -> Result<Client, ClientError> {
        let env_token = std::env::var("SANDBOX_TOKEN").ok();
        let token = client::load_token(env_token.as_deref(), self.token_file.as_deref())?;
        Client::new(&self.server, token)
    }
}

#[derive(Args, Debug)]
struct ExecArgs {
    #[command(flatten)]
    conn: Conn,
    /// Run the command words, joined by spaces, with the sandbox's `sh -c`.
    #[arg(long)]
    shell: bool,
    /// Working directory inside the sandbox (default /workspace).
    #[arg(long)]
    cwd: Option<String>,
    /// Environment variable for the command, `KEY=VALUE` (repeatable).
    #[arg(short, long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Kill the command after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<u32>,
    /// The user to run as inside the sandbox.
    #[arg(long)]
    user: Option<String>,
    /// Send this process's standard input (UTF-8 text) to the command.
    #[arg(long)]
    stdin: bool,
    /// Start the command in the background and print its pid; follow it with
    /// `sandbox attach`, list it with `sandbox ps`, end it with `sandbox kill`.
    #[arg(long)]
    background: bool,
    /// With `--background`: a name to find the process by instead of its pid.
    #[arg(long, requires = "background")]
    tag: Option<String>,
    /// With `--background`: keep the process's stdin open for input.
    #[arg(long, requires = "background")]
    keep_stdin: bool,
    /// The session.
    session: String,
    /// The command and its arguments (after `--` when they start with a dash).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

#[derive(Subcommand, Debug)]
enum FilesCommand {
    /// Download a file (to stdout, or to `-o FILE`).
    Get {
        #[command(flatten)]
        conn: Conn,
        /// Write to this file instead of stdout.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Use the streamed route (larger limit; needs a backend that streams files).
        #[arg(long)]
        stream: bool,
        session: String,
        /// Absolute path inside the sandbox.
        path: String,
    },
    /// Upload a local file (`-` for stdin) to a path inside the sandbox.
    Put {
        #[command(flatten)]
        conn: Conn,
        /// Upload as a user attachment (below /workspace/input).
        #[arg(long, conflicts_with = "stream")]
        attachment: bool,
        /// Use the streamed route: never held whole by the service, up to
        /// `limits.stream_file_max_bytes` (needs a backend that streams files).
        #[arg(long)]
        stream: bool,
        session: String,
        /// The local file, or `-` for stdin.
        local: PathBuf,
        /// Absolute path inside the sandbox.
        path: String,
    },
    /// Rename (move) a file or directory inside the sandbox.
    Mv {
        #[command(flatten)]
        conn: Conn,
        session: String,
        /// Absolute path inside the sandbox.
        from: String,
        /// Absolute path inside the sandbox (parents are created, a file there replaced).
        to: String,
    },
    /// List a directory (kind, size, path), recursively to `--depth`.
    Ls {
        #[command(flatten)]
        conn: Conn,
        /// Levels to descend (1 = the directory's own entries).
        #[arg(long, default_value_t = 1)]
        depth: u32,
        /// Print the service's JSON instead of lines.
        #[arg(long)]
        json: bool,
        session: String,
        /// Absolute path inside the sandbox.
        #[arg(default_value = "/workspace")]
        path: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let env: BTreeMap<String, String> = std::env::vars().collect();
    match cli.command {
        Command::Serve { config } => {
            let config = match ServiceConfig::load(config.as_deref(), &env) {
                Ok(c) => c,
                Err(e) => return fail(&format!("config: {e}")),
            };
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => return fail(&format!("cannot start the runtime: {e}")),
            };
            match runtime.block_on(sandbox_app::serve::serve(config)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e),
            }
        }
        Command::Doctor { config } => {
            let config = match ServiceConfig::load(config.as_deref(), &env) {
                Ok(c) => c,
                Err(e) => {
                    return fail(&format!(
                        "config: {e}\n       fix: correct the config file or the SANDBOX_* variable it names"
                    ));
                }
            };
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => return fail(&format!("cannot start the runtime: {e}")),
            };
            let checks = runtime.block_on(sandbox_app::doctor::run(&config));
            // The report is the command's output.
            let _ = write!(
                std::io::stdout(),
                "{}",
                sandbox_app::doctor::render(&checks)
            );
            if checks.iter().all(|c| c.ok) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Exec(args) => client_command(|| exec(args)),
        Command::Files(command) => client_command(|| files(command)),
        Command::Shell { conn, session, pid } => client_command(|| async move {
            let client = conn.client()?;
            client::shell::run(&client, &session, pid).await
        }),
        Command::Ps {
            conn,
            json,
            session,
        } => client_command(|| async move {
            let client = conn.client()?;
            let processes = client::processes::list(&client, &session).await?;
            let text = if json {
                serde_json::to_string_pretty(&processes).unwrap_or_default() + "\n"
            } else {
                client::processes::render(&processes)
            };
            std::io::stdout()
                .write_all(text.as_bytes())
                .map_err(|e| ClientError::Local(format!("cannot write the list: {e}")))?;
            Ok(0)
        }),
        Command::Attach {
            conn,
            from,
            session,
            process,
        } => client_command(|| async move {
            let client = conn.client()?;
            let (mut out, mut err) = (tokio::io::stdout(), tokio::io::stderr());
            let exited =
                client::processes::attach(&client, &session, &process, from, &mut out, &mut err)
                    .await?;
            Ok(exited.status())
        }),
        Command::Kill {
            conn,
            signal,
            session,
            process,
        } => client_command(|| async move {
            let client = conn.client()?;
            client::processes::kill(&client, &session, &process, &signal).await?;
            Ok(0)
        }),
        Command::Watch {
            conn,
            recursive,
            json,
            session,
            path,
        } => client_command(|| async move {
            let client = conn.client()?;
            let mut out = tokio::io::stdout();
            client::processes::watch(&client, &session, &path, recursive, json, &mut out).await?;
            Ok(0)
        }),
    }
}

/// Runs a client command on a small runtime; its status, or 1 with the error on stderr.
fn client_command<F, Fut>(command: F) -> ExitCode
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<u8, ClientError>>,
{
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(&format!("cannot start the runtime: {e}")),
    };
    match runtime.block_on(command()) {
        Ok(status) => ExitCode::from(status),
        Err(e) => fail(&e.to_string()),
    }
}

async fn exec(args: ExecArgs) -> Result<u8, ClientError> {
    let client = args.conn.client()?;
    if args.background {
        return background(client, args).await;
    }
    let env = parse_env(&args.env)?;
    let stdin = if args.stdin {
        let mut bytes = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut bytes)
            .await
            .map_err(|e| ClientError::Local(format!("cannot read stdin: {e}")))?;
        Some(String::from_utf8(bytes).map_err(|_| {
            ClientError::Usage(
                "--stdin takes UTF-8 text; upload binary input with `sandbox files put`".to_owned(),
            )
        })?)
    } else {
        None
    };
    let (command, rest) = match args.command.split_first() {
        Some((first, rest)) => (first.clone(), rest.to_vec()),
        None => return Err(ClientError::Usage("no command given".to_owned())),
    };
    let spec = sandbox_app::api::ExecSpec {
        command: if args.shell {
            args.command.join(" ")
        } else {
            command
        },
        args: if args.shell { Vec::new() } else { rest },
        shell: args.shell,
        stdin,
        env,
        cwd: args.cwd,
        user: args.user,
        timeout_ms: args.timeout.map(|s| i64::from(s) * 1000),
    };
    let (mut out, mut err) = (tokio::io::stdout(), tokio::io::stderr());
    let ended = client::exec::run(&client, &args.session, &spec, &mut out, &mut err).await?;
    if ended.killed {
        let _ = writeln!(
            std::io::stderr(),
            "sandbox: the command was killed at its timeout"
        );
    }
    if ended.overflow {
        let _ = writeln!(
            std::io::stderr(),
            "sandbox: output was dropped because it was read too slowly"
        );
    }
    Ok(ended.status())
}

/// `sandbox exec --background`: starts the command and prints its pid.
async fn background(client: Client, args: ExecArgs) -> Result<u8, ClientError> {
    if args.stdin {
        return Err(ClientError::Usage(
            "--stdin sends input to a command run in the foreground; with --background use --keep-stdin".to_owned(),
        ));
    }
    if args.timeout.is_some() {
        return Err(ClientError::Usage(
            "--timeout bounds a foreground command; end a background one with `sandbox kill`"
                .to_owned(),
        ));
    }
    let env = parse_env(&args.env)?;
    let (command, rest) = match args.command.split_first() {
        Some((first, rest)) => (first.clone(), rest.to_vec()),
        None => return Err(ClientError::Usage("no command given".to_owned())),
    };
    let request = sandbox_app::api::ProcessStartRequest {
        command: if args.shell {
            args.command.join(" ")
        } else {
            command
        },
        args: if args.shell { Vec::new() } else { rest },
        shell: args.shell,
        env,
        cwd: args.cwd,
        user: args.user,
        tag: args.tag,
        stdin: args.keep_stdin,
    };
    let process = client::processes::start(&client, &args.session, &request).await?;
    // The pid is the command's output, for scripts: `pid=$(sandbox exec --background ...)`.
    let _ = writeln!(std::io::stdout(), "{}", process.pid);
    Ok(0)
}

fn parse_env(pairs: &[String]) -> Result<BTreeMap<String, String>, ClientError> {
    let mut env = BTreeMap::new();
    for pair in pairs {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| ClientError::Usage(format!("--env {pair:?}: expected KEY=VALUE")))?;
        env.insert(k.to_owned(), v.to_owned());
    }
    Ok(env)
}

async fn files(command: FilesCommand) -> Result<u8, ClientError> {
    match command {
        FilesCommand::Get {
            conn,
            output,
            stream,
            session,
            path,
        } => {
            let client = conn.client()?;
            match output {
                None => {
                    client::files::get_from(
                        &client,
                        &session,
                        &path,
                        stream,
                        &mut tokio::io::stdout(),
                    )
                    .await?;
                }
                Some(file) => {
                    // Written beside the target and renamed, so a failed download leaves no
                    // truncated file under the name.
                    let partial = file.with_extension("sandbox-partial");
                    let mut sink = tokio::fs::File::create(&partial).await.map_err(|e| {
                        ClientError::Local(format!("cannot create {}: {e}", partial.display()))
                    })?;
                    let got =
                        client::files::get_from(&client, &session, &path, stream, &mut sink).await;
                    if let Err(e) = got {
                        let _ = tokio::fs::remove_file(&partial).await;
                        return Err(e);
                    }
                    tokio::fs::rename(&partial, &file).await.map_err(|e| {
                        ClientError::Local(format!("cannot write {}: {e}", file.display()))
                    })?;
                }
            }
            Ok(0)
        }
        FilesCommand::Put {
            conn,
            attachment,
            stream,
            session,
            local,
            path,
        } => {
            let client = conn.client()?;
            let target = match (attachment, stream) {
                (true, _) => client::files::Target::Attachment,
                (false, true) => client::files::Target::Streamed,
                (false, false) => client::files::Target::Workspace,
            };
            if local.as_os_str() == "-" {
                client::files::put(&client, &session, &path, target, tokio::io::stdin(), None)
                    .await?;
            } else {
                let file = tokio::fs::File::open(&local).await.map_err(|e| {
                    ClientError::Local(format!("cannot open {}: {e}", local.display()))
                })?;
                let meta = file.metadata().await.map_err(|e| {
                    ClientError::Local(format!("cannot read {}: {e}", local.display()))
                })?;
                if !meta.is_file() {
                    return Err(ClientError::Usage(format!(
                        "{} is not a file",
                        local.display()
                    )));
                }
                client::files::put(&client, &session, &path, target, file, Some(meta.len()))
                    .await?;
            }
            Ok(0)
        }
        FilesCommand::Mv {
            conn,
            session,
            from,
            to,
        } => {
            let client = conn.client()?;
            client::files::rename(&client, &session, &from, &to).await?;
            Ok(0)
        }
        FilesCommand::Ls {
            conn,
            depth,
            json,
            session,
            path,
        } => {
            let client = conn.client()?;
            let entries = client::files::list(&client, &session, &path, depth).await?;
            let text = if json {
                serde_json::to_string_pretty(&entries).unwrap_or_default() + "\n"
            } else {
                client::files::render(&entries)
            };
            std::io::stdout()
                .write_all(text.as_bytes())
                .map_err(|e| ClientError::Local(format!("cannot write the listing: {e}")))?;
            Ok(0)
        }
    }
}

/// Structured logs on stderr: `RUST_LOG` filters (default `info`), `SANDBOX_LOG_FORMAT=json`
/// switches to one JSON object per line.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only for a person at a terminal: a log file or collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    if std::env::var("SANDBOX_LOG_FORMAT").is_ok_and(|v| v == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn fail(message: &str) -> ExitCode {
    // The one place the CLI reports a fatal error to its user.
    let _ = writeln!(std::io::stderr(), "sandbox: {message}");
    ExitCode::FAILURE
}
