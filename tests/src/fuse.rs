//! A file system that stops answering, with a program running from it: what a local user
//! can set up to make every reader of the program's files sleep for ever (the FUSE server of
//! `tests/fixtures/fuse_hang.c`). The guard kills the server first (which aborts every
//! request still waiting, so no thread stays stuck), then the program, then unmounts.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{Fixture, FixtureKind, TempDir};

/// The name the served program runs under (its comm).
pub const PROGRAM: &str = "prog";

/// A FUSE mount serving a copy of a fixture as `prog`, and that program running from it.
pub struct HungFs {
    // Dropped in this order: the server (aborting the connection), then the program.
    server: Option<Fixture>,
    program: Option<Fixture>,
    mountpoint: PathBuf,
    _scratch: TempDir,
}

impl HungFs {
    /// Mounts a file system serving fixture `kind`, and starts it from there with `args`
    /// (it answers everything until [`HungFs::hang`]); `hang_comm`: never answer the
    /// threads with this comm, from the start.
    pub fn start(kind: FixtureKind, args: &[&str], hang_comm: Option<&str>) -> Self {
        let scratch = TempDir::new("fuse");
        let mountpoint = scratch.path().join("mnt");
        std::fs::create_dir_all(&mountpoint).unwrap();
        let served = kind.build();
        let mut server_args = vec![mountpoint.to_str().unwrap(), served.to_str().unwrap()];
        server_args.extend(hang_comm);
        let server = Fixture::spawn_with_args(FixtureKind::FuseHang, &server_args);
        let mut fs = Self { server: Some(server), program: None, mountpoint, _scratch: scratch };
        let mut cmd = Command::new(fs.program_path());
        cmd.args(args).stderr(Stdio::inherit());
        fs.program = Some(Fixture::from_command(kind, cmd));
        fs
    }

    /// Where the program runs from, as its mappings name it.
    pub fn program_path(&self) -> PathBuf {
        self.mountpoint.join(PROGRAM)
    }

    /// The running program.
    pub fn program(&self) -> &Fixture {
        self.program.as_ref().expect("started")
    }

    /// From now on the server answers nothing.
    pub fn hang(&self) {
        self.server.as_ref().expect("running").signal(libc::SIGUSR1);
    }

    /// Kills the server: every request still waiting ends (ENOTCONN).
    pub fn kill_server(&mut self) {
        self.server.take();
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }
}

impl Drop for HungFs {
    fn drop(&mut self) {
        self.server.take();
        self.program.take();
        let _ = Command::new("umount").arg("-l").arg(&self.mountpoint).status();
    }
}
