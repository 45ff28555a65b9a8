//! `rblk-target`: serve volumes in registered memory over RDMA.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use rblk_target::config::{File as ConfigFile, FileVolume, DEFAULT_STATE_DIR};
use rblk_target::notify;
use rblk_target::server::{Running, Server};
use rblk_target::start::StartError;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

use rblk_target::admin::{self, Request};
use rblk_target::cli::{Admin, AdminOp, Args, Command};

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rblk-target: {e:#}");
            if e.downcast_ref::<StartError>().is_some_and(|e| matches!(e, StartError::NoDevice(_))) {
                eprintln!("rblk-target: {}", rblk_fabric::why_no_device());
            }
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    if let Some(Command::Admin(admin)) = &args.command {
        return run_admin(admin);
    }
    let file = effective(&args)?;
    if args.print_config || args.check_config {
        // Checked like a start would, so that a bad file does not print and exit 0.
        file.server_config().map_err(anyhow::Error::from)?;
        if args.check_config {
            println!("configuration OK");
        } else {
            print!("{}", file.to_toml());
        }
        return Ok(());
    }
    let cfg = file.server_config().map_err(anyhow::Error::from)?;
    // Before the start: a signal during a long volume load waits instead of killing us, and
    // SIGHUP no longer ends the daemon.
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]).context("installing signal handlers")?;
    let running = Server::start_with(cfg, &mut notify::progress)?;
    eprintln!("rblk-target: listening on {}", running.local_addr());
    notify::ready(&notify::serving(running.volumes().len(), running.local_addr()));
    // Sleeps until a signal arrives: an idle daemon uses no CPU.
    for signal in signals.forever() {
        if signal == SIGHUP {
            reload(&args, &running);
            continue;
        }
        tracing::info!(signal, "signal received: shutting down");
        break;
    }
    notify::stopping(running.durable_bytes());
    running.shutdown();
    Ok(())
}

/// SIGHUP: the configuration again, from the file and the same flags, applied to `running`.
fn reload(args: &Args, running: &Running) {
    tracing::info!("SIGHUP: reloading the configuration");
    notify::reloading();
    let result = effective(args)
        .and_then(|file| file.server_config().map_err(anyhow::Error::from))
        .and_then(|cfg| running.reload_with(cfg, &mut notify::progress).map_err(anyhow::Error::from));
    let mut status = notify::serving(running.volumes().len(), running.local_addr());
    match result {
        Ok(report) => {
            eprintln!("rblk-target: configuration reloaded: {report}");
            if !report.busy.is_empty() {
                let busy: Vec<&str> = report.busy.iter().map(|(name, _)| name.as_str()).collect();
                status.push_str(&format!(" (removal waits for open sessions: {})", busy.join(", ")));
            }
        }
        Err(e) => {
            tracing::error!("reload refused, nothing changed: {e:#}");
            eprintln!("rblk-target: reload refused, nothing changed: {e:#}");
            status.push_str(&format!(" (last reload refused: {e:#})"));
        }
    }
    notify::ready(&status);
}

/// The effective configuration: the file, then the flags on top (at start and at each reload).
fn effective(args: &Args) -> anyhow::Result<ConfigFile> {
    let mut file = match &args.config {
        Some(path) => ConfigFile::read(path).map_err(anyhow::Error::from)?,
        None => ConfigFile::default(),
    };
    if let Some(listen) = args.listen {
        file.listen = Some(listen.to_string());
    }
    if let Some(metrics) = args.metrics {
        file.metrics = Some(metrics.to_string());
    }
    if args.admin_socket.is_some() {
        file.admin_socket.clone_from(&args.admin_socket);
    }
    if file.admin_socket.is_none() {
        file.admin_socket = Some(admin::DEFAULT_SOCKET.into());
    }
    if args.device.is_some() {
        file.device.clone_from(&args.device);
    }
    if args.key_file.is_some() {
        file.key_file.clone_from(&args.key_file);
    }
    if args.state_dir.is_some() {
        file.state_dir.clone_from(&args.state_dir);
    }
    let limits = [
        (&mut file.max_unopened, args.max_unopened),
        (&mut file.max_unopened_per_addr, args.max_unopened_per_addr),
        (&mut file.max_sessions, args.max_sessions),
        (&mut file.max_sessions_per_host, args.max_sessions_per_host),
    ];
    for (field, flag) in limits {
        if let Some(n) = flag {
            *field = Some(usize::try_from(n).unwrap_or(usize::MAX));
        }
    }
    if args.open_timeout.is_some() {
        file.open_timeout = args.open_timeout;
    }
    if args.keepalive_timeout.is_some() {
        file.keepalive_timeout = args.keepalive_timeout;
    }
    if args.memory_windows.is_some() {
        file.memory_windows = args.memory_windows;
    }
    if file.state_dir.is_none() {
        file.state_dir = Some(DEFAULT_STATE_DIR.into());
    }
    if !args.volumes.is_empty() {
        file.volumes = args
            .volumes
            .iter()
            .map(|v| FileVolume {
                name: v.name.clone(),
                size: v.size.into(),
                path: v.path.clone(),
                ..FileVolume::default()
            })
            .collect();
    }
    if file.volumes.is_empty() {
        file.volumes = vec![FileVolume { name: "vol0".into(), size: "1G".into(), ..FileVolume::default() }];
    }
    Ok(file)
}

/// `rblk-target admin ...`: one request to the running daemon.
fn run_admin(admin: &Admin) -> anyhow::Result<()> {
    let request = match &admin.op {
        AdminOp::Add { volume, allow } => Request::Add {
            volume: FileVolume {
                name: volume.name.clone(),
                size: volume.size.into(),
                path: volume.path.clone(),
                allow: allow.iter().cloned().collect(),
            },
        },
        AdminOp::Remove { name } => Request::Remove { name: name.clone() },
        AdminOp::List { .. } => Request::List,
    };
    let reply = admin::request(&admin.socket, &request)?;
    match &admin.op {
        AdminOp::List { json: true } => println!("{}", serde_json::to_string_pretty(&reply.volumes)?),
        AdminOp::List { json: false } => {
            println!("{:<24} {:>14} {:>8}  {:<8} BACKING", "NAME", "SIZE", "SESSIONS", "STATE");
            for v in reply.volumes.unwrap_or_default() {
                let backing = v.path.as_ref().map_or_else(|| "RAM".to_owned(), |p| p.display().to_string());
                let mut state = v.state.clone();
                if !v.configured {
                    state.push_str(" (removal pending)");
                }
                let why = v.reason.map(|r| format!(" ({r})")).unwrap_or_default();
                println!("{:<24} {:>14} {:>8}  {:<8} {backing}{why}", v.name, v.size, v.sessions, state);
            }
        }
        _ => println!("{}", reply.message),
    }
    Ok(())
}
