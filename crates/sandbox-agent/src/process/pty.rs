//! Pseudo-terminals for `Start` with `pty`, through rustix's safe wrappers.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{Mode, OFlags};
use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;

/// A PTY pair: the master stays with the agent, the slave becomes the process's stdio.
#[derive(Debug)]
pub(crate) struct Pair {
    pub(crate) master: OwnedFd,
    pub(crate) slave: OwnedFd,
}

/// Opens a PTY pair sized `cols` × `rows`.
pub(crate) fn open(cols: u32, rows: u32) -> io::Result<Pair> {
    let master =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let name = rustix::pty::ptsname(&master, Vec::new())?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    resize(&master, cols, rows)?;
    Ok(Pair { master, slave })
}

/// Sets the window size (the kernel sends the foreground group SIGWINCH).
pub(crate) fn resize(fd: impl AsFd, cols: u32, rows: u32) -> io::Result<()> {
    let clamp = |n: u32| u16::try_from(n).unwrap_or(u16::MAX);
    rustix::termios::tcsetwinsize(
        fd,
        Winsize {
            ws_row: clamp(rows),
            ws_col: clamp(cols),
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )?;
    Ok(())
}

/// The window size now.
#[cfg(test)]
pub(crate) fn size(fd: impl AsFd) -> io::Result<(u16, u16)> {
    let w = rustix::termios::tcgetwinsize(fd)?;
    Ok((w.ws_col, w.ws_row))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_opens_with_its_size_and_resizes() {
        let pair = open(100, 40).unwrap();
        assert_eq!(size(&pair.slave).unwrap(), (100, 40));
        resize(&pair.master, 80, 24).unwrap();
        assert_eq!(size(&pair.slave).unwrap(), (80, 24));
    }
}
