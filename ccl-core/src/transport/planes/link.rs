//! What carries one plane's frames: a TCP socket, or another transport's endpoint on that
//! plane's device (a verbs connection on one NIC port).
//!
//! The striping, the acknowledgements and the failover above are the same for both: a link only
//! moves bytes without blocking and says when it has none (`WouldBlock`), and a failure is an
//! error. An endpoint's failure keeps its own error (it names the device and the peer).

use std::os::fd::AsRawFd;

use super::*;

pub(super) enum Link {
    Tcp(Arc<TcpStream>),
    Endpoint(Box<dyn Endpoint>),
    /// A failed connection taken away (to be made again, or for good).
    Gone,
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "the plane's connection failed")
}

impl Link {
    /// Reads what is there. `Ok(0)` is a TCP stream's end; nothing yet is `WouldBlock`.
    pub(super) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Link::Tcp(s) => (&**s).read(buf),
            Link::Endpoint(ep) => match ep.recv(buf) {
                Ok(0) => Err(io::ErrorKind::WouldBlock.into()),
                Ok(n) => Ok(n),
                Err(e) => Err(io::Error::other(e)),
            },
            Link::Gone => Err(gone()),
        }
    }

    /// Writes a prefix of `parts`; a link that takes nothing now says `WouldBlock`.
    pub(super) fn write_vectored(&mut self, parts: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Link::Tcp(s) => (&**s).write_vectored(parts),
            Link::Endpoint(ep) => {
                let mut n = 0;
                for p in parts {
                    let k = ep.send(p).map_err(io::Error::other)?;
                    n += k;
                    if k < p.len() {
                        break;
                    }
                }
                if n == 0 {
                    Err(io::ErrorKind::WouldBlock.into())
                } else {
                    Ok(n)
                }
            }
            Link::Gone => Err(gone()),
        }
    }

    /// Before the caller sleeps on this link's descriptors: `Ok(false)` when it could move bytes
    /// now (an endpoint arms its notifications here and may find completions meanwhile).
    pub(super) fn prepare_wait(&mut self, send: bool) -> Result<bool> {
        match self {
            Link::Tcp(_) | Link::Gone => Ok(true),
            Link::Endpoint(ep) => ep.prepare_wait(Interest { send, recv: true }),
        }
    }
}

/// The error a link's failure is reported as: an endpoint's own error (it says what broke),
/// else the socket's, named after the plane.
pub(super) fn link_error(e: io::Error, what: impl FnOnce() -> String) -> Error {
    if e.get_ref().is_some_and(|x| x.is::<Error>()) {
        let inner = e
            .into_inner()
            .and_then(|x| x.downcast::<Error>().ok())
            .expect("checked above");
        return inner.context(what());
    }
    Error::io(classify_io(&e), what(), e)
}

/// A descriptor the caller sleeps on for one plane, and what to wait for on it.
pub(super) struct WaitFd {
    pub(super) plane: usize,
    fd: WaitSource,
    /// What the link asks for while it is usable: to receive (acks, data), and to send too.
    recv: PollFlags,
    both: PollFlags,
    pub(super) flags: PollFlags,
}

enum WaitSource {
    Tcp(Arc<TcpStream>),
    /// A copy of an endpoint's descriptor (the endpoint lives behind the planes' lock, so the
    /// waiter cannot borrow its own).
    Owned(OwnedFd),
}

impl WaitFd {
    pub(super) fn tcp(plane: usize, s: &Arc<TcpStream>) -> WaitFd {
        WaitFd {
            plane,
            fd: WaitSource::Tcp(s.clone()),
            recv: PollFlags::POLLIN,
            both: PollFlags::POLLIN | PollFlags::POLLOUT,
            flags: PollFlags::POLLIN,
        }
    }

    /// Copies of every descriptor `ep` waits on, with what it waits for when only receiving
    /// and when sending too.
    pub(super) fn of_endpoint(plane: usize, ep: &dyn Endpoint) -> io::Result<Vec<WaitFd>> {
        let (mut recv, mut both) = (Vec::new(), Vec::new());
        ep.wait_fds(
            Interest {
                send: false,
                recv: true,
            },
            &mut recv,
        );
        ep.wait_fds(
            Interest {
                send: true,
                recv: true,
            },
            &mut both,
        );
        both.into_iter()
            .map(|(fd, flags)| {
                let raw = fd.as_raw_fd();
                let r = recv
                    .iter()
                    .filter(|(f, _)| f.as_raw_fd() == raw)
                    .fold(PollFlags::empty(), |a, (_, fl)| a | *fl);
                Ok(WaitFd {
                    plane,
                    fd: WaitSource::Owned(fd.try_clone_to_owned()?),
                    recv: r,
                    both: flags,
                    flags: r,
                })
            })
            .collect()
    }

    pub(super) fn fd(&self) -> BorrowedFd<'_> {
        match &self.fd {
            WaitSource::Tcp(s) => s.as_fd(),
            WaitSource::Owned(fd) => fd.as_fd(),
        }
    }

    /// Sets what to wait for: nothing on a failed plane; else to receive (acks, data), and to
    /// send when a frame is half written (a sender waiting for room in the window waits for an
    /// ack).
    pub(super) fn set(&mut self, usable: bool, half_written: bool) {
        self.flags = match (usable, half_written) {
            (false, _) => PollFlags::empty(),
            (true, false) => self.recv,
            (true, true) => self.both,
        };
    }
}
