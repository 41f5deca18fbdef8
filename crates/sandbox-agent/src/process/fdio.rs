//! Non-blocking reads and writes of a process's pipes and PTY master on the runtime's reactor.
//!
//! tokio's process module is deliberately not used (it would wait for children itself, racing
//! the one reaper, see `pid1`), so the pipe ends std hands over are registered here.

use std::io;
use std::os::fd::OwnedFd;

use tokio::io::unix::AsyncFd;

/// One pipe end or a PTY master, non-blocking.
#[derive(Debug)]
pub(crate) struct AsyncIo {
    fd: AsyncFd<OwnedFd>,
    /// A PTY master answers EIO once every slave handle is closed: that is its end of file.
    eio_is_eof: bool,
}

impl AsyncIo {
    pub(crate) fn new(fd: OwnedFd, eio_is_eof: bool) -> io::Result<Self> {
        rustix::io::ioctl_fionbio(&fd, true)?;
        Ok(AsyncIo {
            fd: crate::sys::register(fd)?,
            eio_is_eof,
        })
    }

    pub(crate) fn get_ref(&self) -> &OwnedFd {
        self.fd.get_ref()
    }

    fn map_read(&self, r: rustix::io::Result<usize>) -> io::Result<usize> {
        match r {
            Err(rustix::io::Errno::IO) if self.eio_is_eof => Ok(0),
            other => other.map_err(io::Error::from),
        }
    }

    /// Reads what is there (at least one byte), or 0 at end of file.
    pub(crate) async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            let result = guard.try_io(|fd| {
                let r = rustix::io::read(fd.get_ref(), &mut *buf);
                self.map_read(r)
            });
            match result {
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    /// Writes some of `buf` (at least one byte).
    pub(crate) async fn write(&self, buf: &[u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.writable().await?;
            let result =
                guard.try_io(|fd| rustix::io::write(fd.get_ref(), buf).map_err(io::Error::from));
            match result {
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    /// Writes all of `buf`.
    pub(crate) async fn write_all(&self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            let n = self.write(buf).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            buf = &buf[n..];
        }
        Ok(())
    }
}
