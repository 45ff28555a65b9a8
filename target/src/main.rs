//! `rblk-target`: serve volumes in registered memory over RDMA.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use rblk_target::config::{File as ConfigFile, FileVolume, KeySource};
use rblk_target::handover::{self, Handed};
use rblk_target::lint;
use rblk_target::notify;
use rblk_target::server::{Running, Server};
use rblk_target::start::StartError;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

use rblk_target::admin::{self, Request};
use rblk_target::cli::{Admin, AdminOp, Args, Command, Format};

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rblk-target: {e:#}");
            if e.downcast_ref::<StartError>().is_some_and(|e| matches!(e, StartError::NoDevice(_))) {
                eprintln!("rblk-target: {}", rblk_fabric::why_no_device());
            }
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<ExitCode> {
    match &args.command {
        Some(Command::Admin(admin)) => return run_admin(admin).map(|()| ExitCode::SUCCESS),
        Some(Command::GenKey { file }) => return gen_key(file).map(|()| ExitCode::SUCCESS),
        None => {}
    }
    let file = args.effective()?;
    // Checked like a start would (a bad file neither prints and exits 0 nor makes a key); a
    // key the first start would make is not made for the check.
    if let KeySource::Generated(path) = file.key_source() {
        if !path.exists() && (args.print_config || args.check_config) {
            eprintln!("rblk-target: no key is configured: the first start makes {}", path.display());
        }
    }
    let checked = file.as_checked().server_config().map_err(anyhow::Error::from)?;
    if args.print_config || args.check_config {
        for text in rblk_target::resources::warnings(&checked) {
            eprintln!("rblk-target: warning: {text}");
        }
        let mut findings = lint(&checked)?;
        findings.extend(lint::decimal_sizes(&file));
        findings.extend(lint::state_dir(&file));
        for f in &findings {
            eprintln!("rblk-target: {f}");
        }
        let errors = findings.iter().filter(|f| f.level == lint::Level::Error).count();
        if args.check_config {
            if errors > 0 {
                let errors = if errors == 1 { "an error".to_owned() } else { format!("{errors} errors") };
                anyhow::bail!("the configuration has {errors}, above: the daemon would not work as meant");
            }
            compare_with_running(&checked)?;
            println!("configuration OK");
        } else {
            let saved = match &file.state_dir {
                Some(dir) => rblk_target::saved::Saved::load(dir)?.note(dir),
                None => String::new(),
            };
            print!("{}{saved}{}", file.unset_notes(), file.with_defaults().to_toml());
        }
        return Ok(ExitCode::SUCCESS);
    }
    // As daemons do: the limits --check-config judged are the hard ones.
    rblk_target::resources::raise_soft_limits();
    let created = file.generate_key()?;
    file.generate_target_id()?;
    let cfg = file.server_config().map_err(anyhow::Error::from)?;
    announce_key(&file, created);
    if let Some(id) = cfg.target_id {
        // What `rblk --target-id` pins ahead of a first connection.
        tracing::info!(target_id = %rblk_proto::to_hex(&id), "target identity");
    }
    // What --check-config fails on, a start only warns about (it accepted these before).
    for f in lint(&cfg)?.into_iter().chain(lint::decimal_sizes(&file)) {
        tracing::warn!("{}", f.text);
    }
    // Before the start: a signal during a long volume load waits instead of killing us, and
    // SIGHUP no longer ends the daemon.
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]).context("installing signal handlers")?;
    // A handover through systemd's fd store: the descriptors came back at this start.
    let stored = Handed::from_store(rblk_fabric::fdpass::listen_fds().context("reading LISTEN_FDS")?)?;
    let mut running = match (stored, args.takeover) {
        (Some(handed), _) => {
            eprintln!(
                "rblk-target: taking the volumes over from the file descriptor store ({})",
                handed.state().daemon
            );
            Server::take_over(cfg, handed, &mut notify::progress)?
        }
        (None, true) => {
            let socket = cfg.admin_socket.clone().context(
                "--takeover talks to the running daemon's admin socket, and the configuration has none \
                 (admin_socket = \"none\")",
            )?;
            let handed = Handed::request(&socket)?;
            eprintln!(
                "rblk-target: {} (pid {}) handed over {}",
                handed.state().daemon,
                handed.state().pid,
                rblk_target::counted(handed.state().volumes.len(), "volume")
            );
            Server::take_over(cfg, handed, &mut notify::progress)?
        }
        (None, false) => Server::start_with(cfg, &mut notify::progress)?,
    };
    eprintln!("rblk-target: listening on {}", running.local_addr());
    notify::ready(&notify::serving(running.volumes().len(), running.local_addr()));
    handover::forget_stored(&running.finish_takeover());
    if notify::has_service_manager() {
        running.set_fd_store(Box::new(notify::store_fd));
    }
    let closer = signals.handle();
    running.on_handed_over(move || closer.close());
    // Sleeps until a signal arrives (or a handover ends it): an idle daemon uses no CPU.
    for signal in signals.forever() {
        if signal == SIGHUP {
            reload(&args, &running);
            continue;
        }
        tracing::info!(signal, "signal received: shutting down");
        break;
    }
    if let Some(status) = running.handed_over() {
        notify::stopping(0);
        // The initiators reconnect to the successor now, on the same cores: this daemon's
        // teardown (unpinning and unmapping every volume, which grows with their size) runs
        // only when the CPU has nothing else to do (scripts/handover-rxe.sh measures the pause).
        if let Err(e) = rblk_fabric::run_only_when_idle() {
            tracing::debug!(error = %e, "SCHED_IDLE for the teardown");
        }
        running.shutdown();
        eprintln!("rblk-target: the volumes were handed over: exiting with status {status}");
        return Ok(ExitCode::from(status));
    }
    notify::stopping(running.durable_bytes());
    running.shutdown();
    Ok(ExitCode::SUCCESS)
}

/// The findings of `--check-config` beyond a start's checks ([`rblk_target::lint`]).
fn lint(cfg: &rblk_target::server::Config) -> anyhow::Result<Vec<lint::Finding>> {
    let policy = cfg.check()?;
    Ok(lint::lint(cfg, &policy, lint::Memory::of_this_host()))
}

/// `--check-config` against the daemon serving the admin socket, if one does: prints the access
/// changes a reload of `cfg` would make there, and fails if that reload would be refused for
/// widening access without `confirm_widen = true`. Without a daemon there is nothing to compare.
fn compare_with_running(cfg: &rblk_target::server::Config) -> anyhow::Result<()> {
    use rblk_target::access_changes;
    let Some(socket) = cfg.admin_socket.as_deref() else { return Ok(()) };
    let running = match admin::request(socket, &Request::Access).map(|reply| reply.access) {
        Ok(Some(access)) => access,
        Err(admin::ClientError::NotRunning(_)) => return Ok(()),
        Ok(None) | Err(_) => {
            eprintln!(
                "rblk-target: note: the daemon at {} did not tell its access policy (not root, or an older daemon): \
                 access changes not compared",
                socket.display()
            );
            return Ok(());
        }
    };
    let new = cfg.check()?.snapshot(cfg.volumes.iter().map(|v| v.name.as_str()));
    for change in access_changes::changes(&running, &new) {
        let widens = if change.widens() { " (widens access)" } else { "" };
        eprintln!("rblk-target: against the running daemon: {change}{widens}");
    }
    access_changes::check(&running, &new, cfg.confirm_widen)
        .with_context(|| format!("the daemon at {} would refuse this configuration at a reload", socket.display()))?;
    Ok(())
}

/// SIGHUP: the configuration again, from the file and the same flags, applied to `running`.
fn reload(args: &Args, running: &Running) {
    tracing::info!("SIGHUP: reloading the configuration");
    notify::reloading();
    let result = args
        .effective()
        .and_then(|file| file.server_config())
        .map_err(anyhow::Error::from)
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

/// Says at every start who may connect: where the generated key is and how to give it to a
/// remote initiator, or that any host may.
fn announce_key(file: &ConfigFile, created: bool) {
    match file.key_source() {
        KeySource::Generated(path) => {
            let path = path.display();
            if created {
                eprintln!(
                    "rblk-target: no key is configured, so initiators must now prove the key this start made in {path} \
                     (initiators without it are refused; to serve every host without a key, as before, start with \
                     --allow-any-host)"
                );
            }
            eprintln!(
                "rblk-target: initiators must prove the key in {path}: `rblk` on this host reads it there; copy it to \
                 a remote host keeping it private (scp -p {path} HOST:/etc/rblk/target.key, mode 0600), where rblk \
                 and rblk-bench find it without a flag"
            );
        }
        KeySource::AnyHost => tracing::warn!(
            "--allow-any-host (allow_any_host = true): no key, so ANY initiator that reaches the port may open \
             every volume without an access list"
        ),
        KeySource::Configured if file.allow_any_host == Some(true) => {
            tracing::warn!("allow_any_host has no effect: keys are configured, and initiators must prove them")
        }
        KeySource::Configured => {}
    }
}

/// `rblk-target gen-key FILE`.
fn gen_key(path: &std::path::Path) -> anyhow::Result<()> {
    rblk_fabric::keyfile::generate(path)
        .with_context(|| format!("writing a new key to {} (an existing file is never overwritten)", path.display()))?;
    eprintln!("rblk-target: wrote a new key to {} (mode 0600)", path.display());
    Ok(())
}

/// `rblk-target admin ...`: one request to the running daemon.
fn run_admin(admin: &Admin) -> anyhow::Result<()> {
    let request = match &admin.op {
        AdminOp::Add { volume, allow } => Request::Add {
            volume: FileVolume {
                name: volume.name.clone(),
                size: volume.size.into(),
                // The daemon's working directory is not ours (the unit's is /): it gets the
                // path absolute, and saves it so in admin.toml.
                path: volume
                    .path
                    .as_deref()
                    .map(std::path::absolute)
                    .transpose()
                    .context("making the backing path absolute")?,
                allow: allow.iter().cloned().collect(),
            },
        },
        AdminOp::Remove { name } => Request::Remove { name: name.clone() },
        AdminOp::Resize { name, size } => Request::Resize { name: name.clone(), size: *size },
        AdminOp::Handover => {
            let expect = handover::preflight(&admin.socket)?;
            eprintln!("rblk-target: the successor's checks pass for {}", rblk_target::counted(expect.len(), "volume"));
            Request::Handover { expect: Some(expect) }
        }
        AdminOp::List { .. } => Request::List,
    };
    let reply = admin::request(&admin.socket, &request)?;
    match &admin.op {
        AdminOp::List { output_format, json } if *json || *output_format == Format::Json => {
            println!("{}", serde_json::to_string_pretty(&reply.volumes)?)
        }
        AdminOp::List { .. } => {
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
