//! Passing descriptors (memory files, eventfds) between processes over a Unix socket.

use std::io::{self, IoSlice, IoSliceMut, Read};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

/// Most descriptors one message carries (a pair's five, a host segment's file and one eventfd
/// per rank of the host).
pub const MAX_FDS: usize = 160;

/// Sends `bytes` with `fds` attached (to the first byte). The stream is blocking.
pub fn send(sock: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let mut sent = 0;
    while sent < bytes.len() {
        let iov = [IoSlice::new(&bytes[sent..])];
        // Descriptors go with the first write only.
        let cm: &[ControlMessage<'_>] = if sent == 0 { &cmsg } else { &[] };
        match sendmsg::<()>(sock.as_raw_fd(), &iov, cm, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Receives exactly `buf.len()` bytes and the descriptors attached to them. Blocking; the
/// socket's read timeout bounds each wait.
pub fn recv(sock: &UnixStream, buf: &mut [u8]) -> io::Result<Vec<OwnedFd>> {
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let (n, fds) = loop {
        let mut iov = [IoSliceMut::new(buf)];
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => {
                let mut fds = Vec::new();
                let cmsgs = msg.cmsgs().map_err(io::Error::from)?;
                for c in cmsgs {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        for fd in raw {
                            // SAFETY: the kernel has just installed `fd` in this process's
                            // table for this message; nothing else refers to it, so this
                            // `OwnedFd` is its only owner.
                            fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                        }
                    }
                }
                break (msg.bytes, fds);
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    };
    if n == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    // The rest of a message split by the stream carries no descriptors.
    let mut s = sock;
    s.read_exact(&mut buf[n..])?;
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, Write};
    use std::os::fd::AsFd;

    #[test]
    fn descriptors_arrive_with_the_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut f = std::fs::File::from(
            nix::sys::memfd::memfd_create(c"t", nix::sys::memfd::MemFdCreateFlag::empty()).unwrap(),
        );
        f.write_all(b"shared").unwrap();
        send(&a, b"hello", &[f.as_fd(), f.as_fd()]).unwrap();
        let mut buf = [0u8; 5];
        let fds = recv(&b, &mut buf).unwrap();
        assert_eq!(&buf, b"hello");
        assert_eq!(fds.len(), 2);
        let mut g = std::fs::File::from(fds.into_iter().next().unwrap());
        g.rewind().unwrap();
        let mut s = String::new();
        g.read_to_string(&mut s).unwrap();
        assert_eq!(s, "shared");
        drop(a);
        assert!(recv(&b, &mut buf).is_err());
    }
}
