//! Subcommands over images, warm pools, profiles and batches.

use std::path::PathBuf;

use clap::Subcommand;

use super::CreateArgs;

#[derive(Subcommand)]
pub enum ImageCmd {
    /// Import an OCI image-layout tar or a docker-archive tar.
    #[command(after_help = "Example:\n  \
        warren image import /tmp/busybox.tar --name busybox:latest")]
    Import {
        /// The archive (e.g. from `skopeo copy … oci-archive:FILE` or `docker save`).
        file: PathBuf,
        /// Name to store it under, repo[:tag]; sandboxes use it as --image.
        #[arg(long)]
        name: String,
    },
    /// Pull an image from an OCI registry (host[:port]/repo[:tag|@sha256:digest]).
    /// Credentials and plain-HTTP registries are configured in
    /// <home>/registries.toml on the node.
    Pull {
        /// host[:port]/repo[:tag|@sha256:digest].
        reference: String,
        /// No progress lines on stderr.
        #[arg(long, short)]
        quiet: bool,
        /// Print the image record as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Collect unreferenced image content; with --budget, also remove
    /// registry images no sandbox uses (oldest first) until the store fits.
    /// Prints a JSON report.
    Gc {
        /// Most bytes the image store may hold, e.g. 20G.
        #[arg(long)]
        budget: Option<String>,
    },
    /// Push a stored image to a registry (host[:port]/repo:tag).
    Push {
        /// host[:port]/repo:tag to push to.
        reference: String,
        /// The stored image to push under REFERENCE (default: the image
        /// named REFERENCE).
        #[arg(long)]
        from: Option<String>,
    },
    /// Pull an image onto nodes before a batch needs it; answers once every
    /// node holds the digest the reference names now.
    Prewarm {
        /// host[:port]/repo[:tag|@sha256:digest].
        reference: String,
        /// Node names, comma-separated, or `all` (the default).
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
        /// Only nodes carrying this label, e.g. `gpu=h200`. Repeatable.
        #[arg(long = "node-selector", value_name = "K=V")]
        node_selector: Vec<String>,
    },
    /// List images.
    Ls {
        /// One JSON array instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Remove an image.
    Rm {
        /// Its name (repo[:tag]) or digest.
        reference: String,
    },
}

#[derive(Subcommand)]
pub enum PoolCmd {
    /// Create or resize a pool: keep SIZE ready sandboxes of this image and
    /// size; a create asking for the same image and sizes (no command, own
    /// disk or node selector) takes one and gets its labels, env, TTL,
    /// lease and network policy at that moment.
    #[command(after_help = "Example:\n  \
        warren pool set py --image python:3.12 --memory 1G --size 16\n  \
        warren create --image python:3.12 --memory 1G --label task=t1   # served from the pool")]
    Set {
        /// The pool's name (a label value: letters, digits, '-', '_', '.').
        name: String,
        /// The image its sandboxes run (as `warren create --image`).
        #[arg(long)]
        image: String,
        /// CPU limit (as `warren create --cpu`).
        #[arg(long)]
        cpu: Option<String>,
        /// Memory limit (as `warren create --memory`).
        #[arg(long)]
        memory: Option<String>,
        /// CPU reserved (as `warren create --cpu-request`).
        #[arg(long)]
        cpu_request: Option<String>,
        /// Memory reserved (as `warren create --memory-request`).
        #[arg(long)]
        memory_request: Option<String>,
        /// Most processes (as `warren create --pids`).
        #[arg(long)]
        pids: Option<u32>,
        /// Ready sandboxes to keep.
        #[arg(long)]
        size: u32,
        /// The isolation class its members run in (as `warren create
        /// --isolation`); a create takes a member only when it names the
        /// same class (or neither names one).
        #[arg(long, value_parser = clap::value_parser!(warren_core::Isolation))]
        isolation: Option<warren_core::Isolation>,
        /// A main process every member starts with (after `--`): a create
        /// with the same command takes a member already running it.
        #[arg(last = true)]
        cmd: Vec<String>,
    },
    /// List pools: size, ready sandboxes, creates served.
    Ls {
        /// The pools as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a pool and its ready sandboxes (ones already taken stay).
    Rm {
        /// The pool's name.
        name: String,
    },
}

#[derive(Subcommand)]
pub enum ProfileCmd {
    /// List profiles: each task's observed peaks and recommended requests.
    Ls,
    /// Show one profile as JSON.
    Show {
        /// The profile's name (a sandbox's --profile, or its task label).
        name: String,
    },
    /// Print the profile table as TOML.
    Export,
    /// Load a TOML profile table (as written by export).
    Import {
        /// The TOML file.
        file: PathBuf,
    },
    /// Forget a profile's runs and anomaly flag.
    Reset {
        /// The profile's name.
        name: String,
    },
}

#[derive(Subcommand)]
pub enum BatchCmd {
    /// Create COUNT sandboxes from one spec; prints progress, then the batch id.
    #[command(after_help = "Example:\n  \
        b=$(warren batch create --count 50 --batch-label task=swe --image busybox --memory 64M -- sh -c 'exit 0')\n  \
        warren batch inspect $b")]
    Create {
        /// How many sandboxes.
        #[arg(long)]
        count: u32,
        /// Batch label, e.g. task=swe (added to every sandbox's labels).
        #[arg(long = "batch-label")]
        batch_labels: Vec<String>,
        /// Retry an OOM-killed sandbox once with the grown request.
        #[arg(long)]
        retry_on_oom: bool,
        /// Retry a sandbox lost with its node once, on another node.
        #[arg(long)]
        retry_on_lost: bool,
        #[command(flatten)]
        create: Box<CreateArgs>,
        /// Main command for every sandbox, after `--`.
        #[arg(last = true, value_name = "CMD")]
        cmd: Vec<String>,
    },
    /// List batches.
    Ls,
    /// Show a batch as JSON: counts per state, summed usage, failures.
    Inspect {
        /// The batch id.
        id: String,
    },
    /// Destroy a batch's sandboxes.
    Rm {
        /// The batch id.
        id: String,
    },
}

#[derive(Subcommand)]
pub enum VolumeCmd {
    /// Make a volume: a file system of SIZE of its own on a node, kept
    /// until removed; mount it with `warren create -v NAME:/PATH[:ro]`.
    #[command(after_help = "Example:\n  \
        warren volume create datasets --size 20G\n  \
        warren run --image python:3.12 -v datasets:/data -- python3 fetch.py\n  \
        warren create --image python:3.12 -v datasets:/data:ro   # many at once, read-only")]
    Create {
        /// Its name: lowercase letters, digits, '-', '_', '.'.
        name: String,
        /// Its size (e.g. 512M, 20G): bytes and files it can hold.
        #[arg(long)]
        size: String,
        /// In a cluster, labels the node it is made on must carry.
        #[arg(long = "node-selector", value_name = "KEY=VALUE")]
        node_selector: Vec<String>,
    },
    /// List volumes: node, size, bytes used, sandboxes mounting each.
    Ls {
        /// The volumes as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove volumes and everything in them (refused while mounted).
    Rm {
        /// The volumes' names.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum SecretCmd {
    /// Keep a secret, read from FILE or standard input (never from the
    /// command line, where other users see it); give it to sandboxes with
    /// `warren create --secret NAME[,env=VAR|,target=FILE]`.
    #[command(after_help = "Example:\n  \
        printf %s \"$HF_TOKEN\" | warren secret create hf\n  \
        warren run --image python:3.12 --secret hf,env=HF_TOKEN -- python3 fetch.py\n  \
        warren run --image python:3.12 --secret hf -- cat /run/secrets/hf")]
    Create {
        /// Its name: letters, digits, '-' and '_' (kept in lower case).
        name: String,
        /// Where the value is read from; `-` (the default) is standard input.
        #[arg(default_value = "-")]
        file: String,
        /// Free text about it, KEY=VALUE. Repeatable.
        #[arg(long = "metadata", value_name = "KEY=VALUE")]
        metadata: Vec<String>,
    },
    /// Replace a secret's value (sandboxes made from now on get it).
    Set {
        /// The secret's name (or id).
        name: String,
        /// Where the new value is read from; `-` (the default) is standard input.
        #[arg(default_value = "-")]
        file: String,
        /// Replaces its metadata when given, KEY=VALUE. Repeatable.
        #[arg(long = "metadata", value_name = "KEY=VALUE")]
        metadata: Vec<String>,
    },
    /// List secrets (names, versions, metadata; never values).
    Ls {
        /// The secrets as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove secrets (sandboxes given them keep their copies).
    Rm {
        /// The secrets' names (or ids).
        #[arg(required = true)]
        names: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum TenantCmd {
    /// Make a tenant (a team or training run sharing this Warren) and print
    /// a first token for it (an admin token, shown this once).
    #[command(after_help = "Example:\n  \
        warren tenant create team-a --cpu 64 --memory 256G --gpus 8 --weight 2\n  \
        WARREN_TOKEN=wrt_... warren ps      # as team-a: its sandboxes only")]
    Create {
        /// Its name: lower-case letters, digits and '-'.
        name: String,
        #[command(flatten)]
        spec: TenantArgs,
    },
    /// List tenants with what their sandboxes hold against their quotas.
    Ls {
        /// The tenants as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Replace a tenant's quota, weight, priority, preemption and egress
    /// (what is not given is cleared to its default).
    Set {
        /// The tenant's name.
        name: String,
        #[command(flatten)]
        spec: TenantArgs,
    },
    /// Remove tenants and their tokens (refused while one owns anything).
    Rm {
        /// The tenants' names.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

/// A tenant's spec, as flags.
#[derive(clap::Args, Debug)]
pub struct TenantArgs {
    /// CPU its live sandboxes may request in all (cores, or 500m).
    #[arg(long)]
    pub cpu: Option<String>,
    /// Memory its live sandboxes may request in all (e.g. 64G).
    #[arg(long)]
    pub memory: Option<String>,
    /// GPUs its live sandboxes may hold in all.
    #[arg(long)]
    pub gpus: Option<u32>,
    /// Sandboxes it may hold at once.
    #[arg(long)]
    pub sandboxes: Option<u32>,
    /// Its share of a full cluster, relative to other waiting tenants'.
    #[arg(long, default_value_t = 1)]
    pub weight: u32,
    /// Its creates' priority (higher first; lower preempted first).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,
    /// Take its share back by preempting sandboxes others run on borrowed capacity.
    #[arg(long)]
    pub preempt: bool,
    /// An allow rule its sandboxes may use (HOST:PORT); repeatable. With
    /// none given, any the node permits.
    #[arg(long = "egress", value_name = "HOST:PORT")]
    pub egress: Vec<String>,
}

#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// Make a token for a tenant; its value is printed this once.
    Create {
        /// The tenant it acts for.
        #[arg(long)]
        tenant: String,
        /// admin (also manages the tenant's tokens), user, or viewer (reads only).
        #[arg(long, default_value = "user")]
        role: String,
        /// What it is for.
        #[arg(long, default_value = "")]
        description: String,
    },
    /// List tokens (never their values).
    Ls {
        /// The tokens as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke tokens at once.
    Revoke {
        /// The tokens' ids (tok-…).
        #[arg(required = true)]
        ids: Vec<String>,
    },
}
