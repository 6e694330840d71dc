//! `warren-init`: only ever started by a sandbox's set-up (see the library).

fn main() {
    warren_init::main()
}
