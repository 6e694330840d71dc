//! The command line: [`Cli`] and its commands. The flags of each family of
//! commands are in a module of their own and re-exported here.

use clap::{Parser, Subcommand};

mod resources;
mod sandbox;
mod serve;

pub use resources::*;
pub use sandbox::*;
pub use serve::*;

#[derive(Parser)]
#[command(
    name = "warren",
    version,
    about = "Isolated, disposable sandboxes for agent and RL training",
    after_help = "Start with `warren doctor`, then `warren up &` (or `systemctl start warren-up`);\n\
                  `warren COMMAND --help` shows each command's flags and examples."
)]
pub struct Cli {
    #[command(flatten)]
    pub api: warren_cli::ApiArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run control plane, node agent and SQLite store in one process.
    #[command(after_help = "Examples:\n  \
        warren up &                                   # 127.0.0.1:7070, home /var/lib/warren\n  \
        warren up --listen 127.0.0.1:7171 --home /srv/warren\n  \
        systemctl enable --now warren-up              # as a service (scripts/install.sh)\n\n\
        Its log is <home>/warren-up.log; the terminal gets warnings and its own lines.")]
    // Boxed: the daemon's flags make it several times the size of the other
    // commands.
    Up(Box<UpArgs>),
    /// Run a cluster's control plane: the public API, scheduler and store;
    /// nodes join it with `warren node`.
    Server(ServerArgs),
    /// Run a node agent that joins a `warren server` (`warren node --server
    /// URL --join-token FILE`), or manage the cluster's nodes (`ls`,
    /// `cordon`, `uncordon`, `rm`).
    Node(NodeArgs),
    /// Manage images.
    #[command(subcommand)]
    Image(ImageCmd),
    /// Create a sandbox and print its id once it is ready.
    #[command(after_help = "Examples:\n  \
        id=$(warren create --image busybox --cpu 0.5 --memory 256M --label task=demo)\n  \
        warren create --image busybox --allow pypi.org:443        # egress through the proxy\n  \
        warren create --image busybox --lease 30s                 # dies unless `warren heartbeat` renews it\n  \
        warren create --image busybox -- sleep 300                # with a main process")]
    Create {
        #[command(flatten)]
        create: CreateArgs,
        /// A main process (after the options, or after `--`): the sandbox
        /// runs it, and ends as its reclaim policy says when it exits.
        /// Without one the sandbox idles until removed or its TTL ends.
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "CMD"
        )]
        cmd: Vec<String>,
    },
    /// Run a command as a sandbox's main process, stream its output, exit with its code.
    #[command(after_help = "Examples:\n  \
        warren run --image busybox --rm -- sh -c 'echo hello; exit 3'; echo $?   # hello, 3\n  \
        warren run --image busybox --rm echo hi                               # `--` may be left out\n  \
        id=$(warren run -d --image busybox -- sleep 60)                        # detached: the id at once")]
    Run {
        #[command(flatten)]
        create: CreateArgs,
        /// Remove the sandbox when the command ends (returns once it is gone).
        #[arg(long, conflicts_with = "detach")]
        rm: bool,
        /// Detached: print the sandbox's id once its command runs, and
        /// leave it running (`warren logs -f ID` follows it).
        #[arg(long, short = 'd')]
        detach: bool,
        /// The command and its arguments (after the options; `--` first if
        /// it starts with `-`). Without one, the image's own (its
        /// ENTRYPOINT and CMD), as `docker run IMAGE`.
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "CMD"
        )]
        cmd: Vec<String>,
    },
    /// Run a command in a running sandbox.
    #[command(after_help = "Examples:\n  \
        warren exec $id -- sh -c 'hostname; ps'\n  \
        warren exec $id --timeout 2s -- sleep 100        # killed with its whole tree: exit 137\n  \
        echo data | warren exec -i $id -- wc -c\n  \
        warren exec -it $id -- sh                        # a shell on a terminal in the sandbox")]
    Exec(ExecArgs),
    /// Copy files: `warren cp LOCAL ID:PATH` or `warren cp ID:PATH LOCAL`.
    #[command(
        after_help = "A path ending in / is a directory the file goes into under its own name;\n\
        directories travel as tar (their contents are copied into the destination).\n\n\
        Examples:\n  \
        warren cp ./train.py $id:/work/          # -> /work/train.py\n  \
        warren cp $id:/work ./out                # /work's contents into ./out"
    )]
    Cp {
        /// LOCAL path, or ID:/absolute/path in a sandbox.
        src: String,
        /// LOCAL path, or ID:/absolute/path in a sandbox.
        dst: String,
    },
    /// List a directory in a sandbox, or describe a file or link: mode,
    /// owner (ids inside the sandbox), size, modification time (UTC), path.
    #[command(
        after_help = "A symlink is shown as a link (-> target), never followed; end the path\n\
        with / to list the directory it points to (resolved inside the sandbox).\n\n\
        Examples:\n  \
        warren ls $id /work\n  \
        warren ls $id /work --depth 3 --json     # every entry three levels down, as JSON"
    )]
    Ls {
        /// The sandbox id (sbx-…).
        id: String,
        /// Path in the sandbox.
        path: String,
        /// Levels to descend into subdirectories (1: the directory's own entries).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        depth: u32,
        /// One JSON array (as `POST /v1/sandboxes/{id}/paths` answers) instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Make a directory in a sandbox, and its missing parents.
    #[command(after_help = "Example:\n  \
        warren mkdir $id /work/out/logs")]
    Mkdir {
        /// The sandbox id (sbx-…).
        id: String,
        /// Path of the new directory; an existing path is an error.
        path: String,
    },
    /// Rename or move a path in a sandbox (FROM's file or whole directory),
    /// making TO's missing parent directories.
    #[command(after_help = "Example:\n  \
        warren mv $id /work/out /archive/run-1/out")]
    Mv {
        /// The sandbox id (sbx-…).
        id: String,
        /// The path to move.
        from: String,
        /// Its new path (a file there is replaced).
        to: String,
    },
    /// List sandboxes.
    #[command(after_help = "Examples:\n  \
        warren ps --label task=demo\n  \
        warren ps --all --state failed --json")]
    Ps {
        /// Only sandboxes with this label, KEY=VALUE. Repeatable (all must match).
        #[arg(long, value_name = "KEY=VALUE")]
        label: Vec<String>,
        /// Only sandboxes in this state.
        #[arg(
            long,
            value_parser = [
                "queued", "creating", "running", "paused", "stopping",
                "destroyed", "failed", "kept", "lost", "preempted",
            ]
        )]
        state: Option<String>,
        /// Include destroyed, failed, lost and preempted sandboxes.
        #[arg(long, short)]
        all: bool,
        /// One JSON array instead of the table.
        #[arg(long, conflicts_with = "quiet")]
        json: bool,
        /// Only the ids, one per line (as `docker ps -q`).
        #[arg(long, short)]
        quiet: bool,
    },
    /// Live CPU and memory use of running sandboxes, as `docker stats`:
    /// refreshed every second until Ctrl-C, or one reading.
    #[command(after_help = "Examples:\n  \
        warren stats                    # every live sandbox\n  \
        warren stats web $id --no-stream")]
    Stats {
        /// Sandbox ids or names (default: every live sandbox).
        ids: Vec<String>,
        /// One reading, then exit.
        #[arg(long)]
        no_stream: bool,
    },
    /// Show a sandbox as JSON: spec, state, node, usage, events.
    Inspect {
        /// The sandbox id (sbx-…).
        id: String,
    },
    /// Make N new sandboxes that start from a running or paused sandbox's
    /// filesystem as it is now, and print their ids, one per line.
    #[command(
        after_help = "The sandbox's changes are copied once (a running one is frozen for the copy);\n\
        each child writes to its own layer on top, unseen by the source and its siblings.\n\
        Processes are not carried over: each child runs the source's main process anew,\n\
        if it has one. Labels, sizes and lifetimes are the source's unless given here.\n\n\
        Examples:\n  \
        warren fork $id --count 8 --label branch=a      # one environment state, 8 rollouts\n  \
        warren rm --label warren.dev/fork-of=$id        # every child of $id"
    )]
    Fork(ForkArgs),
    /// Build an image from a Dockerfile: each RUN in a Warren sandbox of the
    /// step before (no network unless --allow), each step kept in the node's
    /// step cache. Progress on stderr, the image digest on stdout.
    #[command(after_help = "Examples:\n  \
        warren build -t app:1 .\n  \
        warren build -f docker/Dockerfile -t app:1 --build-arg VERSION=2 .\n  \
        warren build -t app:1 --allow pypi.org:443 --allow files.pythonhosted.org:443 --test 'python3 -c \"import app\"' .")]
    Build(BuildArgs),
    /// Store a sandbox's filesystem changes as a new image: one layer on top
    /// of the image it runs (push it with `warren image push`).
    Commit {
        /// The sandbox id (sbx-…).
        id: String,
        /// Name of the new image, repo[:tag].
        name: String,
    },
    /// Print a sandbox's JSON-lines log (or, with --label, those of every
    /// matching sandbox).
    #[command(
        after_help = "Each line has a `kind`: exec, stdout, stderr, state, net (egress decisions), ...\n\n\
        Examples:\n  \
        warren logs $id\n  \
        warren logs $id | grep '\"kind\":\"net\"'      # every egress decision, with its rule"
    )]
    Logs {
        /// The sandbox id (sbx-…).
        #[arg(required_unless_present = "label")]
        id: Option<String>,
        /// The logs of every sandbox with this label, KEY=VALUE. Repeatable.
        #[arg(long, conflicts_with = "id", value_name = "KEY=VALUE")]
        label: Vec<String>,
        /// Keep printing new lines until the sandbox ends.
        #[arg(long, short)]
        follow: bool,
        /// The log's JSON lines as stored, instead of time, stream and text.
        #[arg(long)]
        json: bool,
        /// With --label: only lines written this long ago or later (e.g. 1h).
        #[arg(long, requires = "label", value_name = "DURATION")]
        since: Option<String>,
        /// The sandbox's usage samples (JSON lines, oldest first) instead of
        /// its log: kept by the control plane, also once its node is gone.
        #[arg(long, conflicts_with_all = ["label", "follow"])]
        usage: bool,
    },
    /// Destroy sandboxes by id or label selector; or, with `ID /PATH`,
    /// remove a file, link or whole directory in a sandbox.
    #[command(after_help = "Examples:\n  \
        warren rm $id\n  \
        warren rm --label task=demo\n  \
        warren rm $id /work/tmp            # the directory and all it holds; the sandbox stays")]
    Rm {
        /// Sandbox ids (sbx-…); or one id and an absolute path in that sandbox.
        #[arg(value_name = "ID|PATH")]
        ids: Vec<String>,
        /// Every sandbox with this label, KEY=VALUE. Repeatable (all must match).
        #[arg(long, value_name = "KEY=VALUE")]
        label: Vec<String>,
    },
    /// Resource profiles: learned requests per task.
    #[command(subcommand)]
    Profile(ProfileCmd),
    /// Warm pools: ready sandboxes that matching creates take at once.
    #[command(subcommand)]
    Pool(PoolCmd),
    /// Volumes: named storage kept across sandboxes, mounted with -v.
    #[command(subcommand)]
    Volume(VolumeCmd),
    /// Secrets: values kept sealed, given to sandboxes with --secret.
    #[command(subcommand)]
    Secret(SecretCmd),
    /// Batches: N sandboxes from one spec.
    #[command(subcommand)]
    Batch(BatchCmd),
    /// Tenants: teams sharing this Warren, with quotas and fair shares.
    #[command(subcommand)]
    Tenant(TenantCmd),
    /// Tokens of tenants (admin, user or viewer).
    #[command(subcommand)]
    Token(TokenCmd),
    /// Show the audit log: every change, with the tenant and token that asked.
    #[command(after_help = "Examples:\n  \
        warren audit --tenant team-a --since 1h\n  \
        warren audit --since 2026-12-06T00:00:00Z --json")]
    Audit {
        /// Only this tenant's calls (a tenant's admin token reads its own only).
        #[arg(long)]
        tenant: Option<String>,
        /// From this long ago (30m, 2h) or this RFC 3339 time.
        #[arg(long)]
        since: Option<String>,
        /// Before this long ago or this RFC 3339 time.
        #[arg(long)]
        until: Option<String>,
        /// At most this many lines (the newest).
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        /// The lines as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show the event stream (state changes with reasons).
    #[command(after_help = "Examples:\n  \
        warren events --sandbox $id\n  \
        warren events --type lease_expired --follow     # Ctrl-C to stop following")]
    Events {
        /// Only this sandbox's events.
        #[arg(long, value_name = "ID")]
        sandbox: Option<String>,
        /// Only events of sandboxes with this label, KEY=VALUE. Repeatable.
        #[arg(long, value_name = "KEY=VALUE")]
        label: Vec<String>,
        /// Only events of this batch's sandboxes.
        #[arg(long, value_name = "BATCH_ID")]
        batch: Option<String>,
        /// Reason or state, e.g. ready, exited, ttl_expired, lease_expired,
        /// oom_killed, destroyed.
        #[arg(long = "type", value_name = "REASON|STATE")]
        kind: Option<String>,
        /// Keep printing new events as they happen (until Ctrl-C).
        #[arg(long, short)]
        follow: bool,
    },
    /// Freeze every process of a running sandbox.
    Pause {
        /// The sandbox id (sbx-…).
        id: String,
    },
    /// Thaw a paused sandbox.
    Resume {
        /// The sandbox id (sbx-…).
        id: String,
    },
    /// Renew a sandbox's lease: a sandbox created with --lease D is
    /// destroyed (reason lease_expired) D after its last heartbeat.
    Heartbeat {
        /// The sandbox id (sbx-…).
        id: String,
    },
    /// Let a sandbox live TTL from now (e.g. 30m).
    Ttl {
        /// The sandbox id (sbx-…).
        id: String,
        /// How long from now, e.g. 90s, 30m, 2h.
        ttl: String,
    },
    /// Change what happens when a running sandbox ends: e.g. keep its
    /// scene (frozen, inspectable) to debug it.
    #[command(after_help = "Example:\n  \
        warren reclaim $id keep --keep-for 2h")]
    Reclaim {
        /// The sandbox id (sbx-…).
        id: String,
        /// destroy, delay, keep, keep_on_failure or pause (as `create --reclaim`).
        #[arg(value_parser = ["destroy", "delay", "keep", "keep_on_failure", "pause"])]
        reclaim: String,
        /// How long a kept sandbox is held (or a delayed one frozen), e.g.
        /// 2h; unchanged when left out.
        #[arg(long)]
        keep_for: Option<String>,
    },
    /// Replace an `allowlist` sandbox's egress rules; connections the new
    /// rules do not allow are closed.
    #[command(after_help = "Example:\n  \
        warren network $id --allow pypi.org:443 --allow '*.s3.amazonaws.com:443'")]
    Network {
        /// The sandbox id (sbx-…).
        id: String,
        /// Egress rule HOST:PORT (name, *.suffix, IPv4 or CIDR). Repeatable.
        #[arg(long, value_name = "HOST:PORT")]
        allow: Vec<String>,
        /// Rule that wins over the allow rules. Repeatable.
        #[arg(long, value_name = "HOST:PORT")]
        deny: Vec<String>,
    },
    /// Forward a local TCP port to a port inside a sandbox (LOCAL:REMOTE,
    /// or just PORT for both).
    #[command(after_help = "Example:\n  \
        warren port-forward $id 8080:8000 &     # local 8080 -> port 8000 in the sandbox")]
    PortForward {
        /// The sandbox id (sbx-…).
        id: String,
        /// LOCAL:REMOTE, or PORT for both.
        #[arg(value_name = "LOCAL:REMOTE")]
        ports: String,
        /// Local address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        address: std::net::IpAddr,
    },
    /// Check this host: kernel features, cgroups, overlayfs, seccomp, user
    /// namespaces, disk limits; say what Warren can and cannot guarantee.
    Doctor {
        /// The checks as JSON.
        #[arg(long)]
        json: bool,
        /// Read CDI specs here instead of /etc/cdi and /var/run/cdi (as the
        /// node's --cdi-dir). Repeatable.
        #[arg(long = "cdi-dir", value_name = "DIR")]
        cdi_dirs: Vec<std::path::PathBuf>,
        /// Check this runsc for the gvisor class (as the node's --runsc);
        /// default: `runsc` on PATH.
        #[arg(long, value_name = "PATH")]
        runsc: Option<std::path::PathBuf>,
        /// Try this gVisor platform (as the node's --runsc-platform).
        #[arg(long, value_name = "NAME")]
        runsc_platform: Option<String>,
    },
    #[command(hide = true)]
    Spawner,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every flag and argument of every command says what it is for.
    #[test]
    fn every_argument_is_described() {
        let missing = warren_cli::undescribed(&super::Cli::command(), "warren");
        assert!(missing.is_empty(), "undescribed: {missing:#?}");
    }
}

#[derive(clap::Args, Debug)]
pub struct BuildArgs {
    /// The Dockerfile, inside the context (default: CONTEXT/Dockerfile).
    #[arg(short = 'f', long = "file")]
    pub file: Option<std::path::PathBuf>,
    /// Name of the result, repo[:tag].
    #[arg(short = 't', long = "tag")]
    pub tag: Option<String>,
    /// A value for an ARG. Repeatable.
    #[arg(long = "build-arg", value_name = "K=V")]
    pub build_args: Vec<String>,
    /// Build this stage (and those it needs) instead of the last.
    #[arg(long)]
    pub target: Option<String>,
    /// A HOST:PORT that RUN steps may reach (a package index). Repeatable.
    #[arg(long, value_name = "HOST:PORT")]
    pub allow: Vec<String>,
    /// A smoke test (sh -c) in a fresh sandbox of the result; if it fails,
    /// the tag is not moved.
    #[arg(long)]
    pub test: Option<String>,
    /// Push the result to this registry reference.
    #[arg(long)]
    pub push: Option<String>,
    /// Run every step, even those the step cache holds.
    #[arg(long)]
    pub no_cache: bool,
    /// No progress or step output on stderr.
    #[arg(long, short)]
    pub quiet: bool,
    /// The build context: a directory.
    pub context: std::path::PathBuf,
}
