//! Memory the ranks of one host share: anonymous memory files, mapped.
//!
//! A [`MemFile`] is a `memfd`: it has no name in any file system, so nothing is left behind when
//! its processes die, even by `kill -9`, and only a process handed its descriptor (over an
//! authenticated Unix socket) can map it. Its pages are allocated with `fallocate` before anyone
//! maps it, so a host short of memory fails here with an error instead of a `SIGBUS` on first
//! touch, and it is sealed against resizing, so a peer cannot shrink it under a mapping either.
//!
//! A [`Mirror`] maps one range of a file twice, back to back, so a ring over it never wraps in
//! the middle of a copy or of an element a reduction reads.

use std::ffi::CString;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use ccl_core::{Error, ErrorKind, Result};
use ccl_diag::human_bytes;
use nix::errno::Errno;
use nix::fcntl::{FallocateFlags, FcntlArg, SealFlag, fallocate, fcntl};
use nix::sys::memfd::{MemFdCreateFlag, memfd_create};
use nix::sys::mman::{MapFlags, ProtFlags, mmap, mmap_anonymous, munmap};

/// The page size this code aligns to (checked against the system's in [`page_size`]).
pub const PAGE: usize = 4096;

/// The system's page size; mappings here assume 4 KiB pages.
pub fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(PAGE, |p| p as usize)
}

fn sys(what: impl Into<String>, e: Errno) -> Error {
    Error::io(ErrorKind::System, what, e.into())
}

/// An anonymous memory file of a fixed size with its pages allocated.
#[derive(Debug)]
pub struct MemFile {
    fd: OwnedFd,
    len: usize,
}

impl MemFile {
    /// Creates a file of `len` bytes (a multiple of the page size). `setting` names what sizes it,
    /// for the error a lack of memory gives.
    pub fn create(name: &str, len: usize, setting: &str) -> Result<MemFile> {
        MemFile::create_sparse(
            name,
            len,
            len,
            &format!("{setting} lowers it, CCL_SHM_DISABLE=1 turns shared memory off"),
        )
    }

    /// Creates a sparse file of `len` bytes (a multiple of the page size) of which only the
    /// first `head` bytes are allocated now: the rest is address space that [`MemFile::allocate`]
    /// fills range by range. Sealed against resizing like [`MemFile::create`].
    pub fn create_sparse(name: &str, len: usize, head: usize, setting: &str) -> Result<MemFile> {
        let cname = CString::new(name).map_err(|_| Error::internal("memfd name with a NUL"))?;
        let fd = memfd_create(
            &cname,
            MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
        )
        .map_err(|e| sys("memfd_create", e))?;
        let off = i64::try_from(len).map_err(|_| Error::internal("memory file too large"))?;
        nix::unistd::ftruncate(&fd, off).map_err(|e| {
            Error::io(
                ErrorKind::System,
                format!(
                    "shared memory: cannot size a memory file to {} ({setting} sets it)",
                    human_bytes(len as u64)
                ),
                e.into(),
            )
        })?;
        fcntl(
            fd.as_raw_fd(),
            FcntlArg::F_ADD_SEALS(
                SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
            ),
        )
        .map_err(|e| sys("sealing a memory file", e))?;
        let f = MemFile { fd, len };
        f.allocate(0, head, setting)?;
        Ok(f)
    }

    /// Allocates the pages of `offset..offset + len` (inside the file), so that no access to
    /// them can fault for lack of memory. `setting` names what sized the request.
    pub fn allocate(&self, offset: usize, len: usize, setting: &str) -> Result<()> {
        let (o, l) = (
            i64::try_from(offset).map_err(|_| Error::internal("offset too large"))?,
            i64::try_from(len).map_err(|_| Error::internal("length too large"))?,
        );
        match fallocate(self.fd.as_raw_fd(), FallocateFlags::empty(), o, l) {
            Ok(()) => Ok(()),
            Err(e @ (Errno::ENOSPC | Errno::ENOMEM)) => Err(Error::io(
                ErrorKind::System,
                format!(
                    "shared memory: cannot allocate {} (the host or this container is short of \
                     memory; {setting})",
                    human_bytes(len as u64)
                ),
                e.into(),
            )),
            Err(e) => Err(sys("fallocate of a memory file", e)),
        }
    }

    /// Gives the pages of `offset..offset + len` back to the system; they read as zeros after.
    pub fn release(&self, offset: usize, len: usize) {
        let _ = fallocate(
            self.fd.as_raw_fd(),
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            offset as i64,
            len as i64,
        );
    }

    /// Takes a file a peer created, checking it is what the protocol says: `len` bytes and sealed
    /// against resizing (so no mapping of it can fault).
    pub fn open(fd: OwnedFd, len: usize) -> Result<MemFile> {
        let st = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(|e| sys("fstat", e))?;
        if st.st_size as u64 != len as u64 {
            return Err(Error::remote(format!(
                "shared memory: the peer's memory file has {} bytes, expected {len}",
                st.st_size
            )));
        }
        let seals = fcntl(fd.as_raw_fd(), FcntlArg::F_GET_SEALS)
            .map_err(|e| sys("reading the seals of a memory file", e))?;
        let need = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW;
        if !SealFlag::from_bits_truncate(seals).contains(need) {
            return Err(Error::remote(
                "shared memory: the peer's memory file is not sealed against resizing",
            ));
        }
        Ok(MemFile { fd, len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn nonzero(len: usize) -> Result<NonZeroUsize> {
    NonZeroUsize::new(len).ok_or_else(|| Error::internal("empty mapping"))
}

/// A shared, read-write mapping of a range of a [`MemFile`].
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a `Mapping` is a plain address range; which thread unmaps it does not matter, and
// access to its contents goes through the types built on it, which state their own rules.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: `&Mapping` only hands out the address.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `file` from `offset` (both page-aligned, inside the file).
    pub fn new(file: &MemFile, offset: usize, len: usize) -> Result<Mapping> {
        Mapping::map(file, offset, len, true)
    }

    /// [`new`](Mapping::new) without filling the page tables: for memory of which a process
    /// touches a part, such as a host segment of many ranks, where each rank reads the first
    /// pages of most slots (small collectives) and whole slots only in large ones. Filling them
    /// all would cost every rank of the host a page-table entry per page of the host's memory
    /// (64 ranks with 2 MiB slots: 32K entries per rank, seconds of set-up for the host).
    pub fn on_touch(file: &MemFile, offset: usize, len: usize) -> Result<Mapping> {
        Mapping::map(file, offset, len, false)
    }

    fn map(file: &MemFile, offset: usize, len: usize, populate: bool) -> Result<Mapping> {
        check_range(file, offset, len)?;
        let fill = if populate {
            MapFlags::MAP_POPULATE
        } else {
            MapFlags::empty()
        };
        // SAFETY:
        // - No address hint: the kernel picks a range that overlaps no existing mapping.
        // - The range lies inside the file (checked), which is sealed against shrinking, so no
        //   access through the mapping can fault past its end.
        let p = unsafe {
            mmap(
                None,
                nonzero(len)?,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                // Page tables filled now (`populate`): otherwise each process takes a fault on
                // the first touch of every page, in the first collectives it runs. The pages
                // themselves are allocated either way (`MemFile::create`).
                MapFlags::MAP_SHARED | fill,
                file.fd(),
                offset as i64,
            )
        }
        .map_err(|e| sys("mmap of shared memory", e))?;
        Ok(Mapping { ptr: p.cast(), len })
    }

    /// Maps all of `file` without touching its pages (no `MAP_POPULATE`, no reservation): for
    /// sparse files, whose unallocated pages must stay unallocated. Accesses must stay within
    /// ranges that [`MemFile::allocate`] allocated, or they may allocate (or, when memory is
    /// short, fault).
    pub fn lazy(file: &MemFile) -> Result<Mapping> {
        check_range(file, 0, file.len())?;
        // SAFETY: no address hint, so the kernel picks a free range; the file is sealed against
        // shrinking, so the mapping never extends past its end.
        let p = unsafe {
            mmap(
                None,
                nonzero(file.len())?,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED | MapFlags::MAP_NORESERVE,
                file.fd(),
                0,
            )
        }
        .map_err(|e| sys("mmap of a shared arena", e))?;
        Ok(Mapping {
            ptr: p.cast(),
            len: file.len(),
        })
    }

    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr+len` is the mapping `new` made, unmapped only here; whatever borrows
        // it (rings, segments) is declared to drop before it.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

fn check_range(file: &MemFile, offset: usize, len: usize) -> Result<()> {
    let ps = page_size();
    if offset % ps != 0 || len % ps != 0 || len == 0 || offset.saturating_add(len) > file.len() {
        return Err(Error::internal(format!(
            "shared memory: range {offset}+{len} of a {}-byte file is not page-aligned inside it",
            file.len()
        )));
    }
    Ok(())
}

/// One range of a file mapped twice, back to back: byte `i` and byte `i + cap` are the same
/// memory, so `cap` bytes starting anywhere in the first copy are contiguous.
#[derive(Debug)]
pub struct Mirror {
    ptr: NonNull<u8>,
    cap: usize,
}

// SAFETY: as for `Mapping`.
unsafe impl Send for Mirror {}
// SAFETY: as for `Mapping`.
unsafe impl Sync for Mirror {}

impl Mirror {
    /// Maps `cap` bytes of `file` from `offset` twice (both page-aligned, inside the file).
    pub fn new(file: &MemFile, offset: usize, cap: usize) -> Result<Mirror> {
        check_range(file, offset, cap)?;
        let twice = cap
            .checked_mul(2)
            .ok_or_else(|| Error::internal("ring too large"))?;
        // SAFETY: no address hint and no file: this only reserves address space (PROT_NONE,
        // nothing committed) that no other mapping uses.
        let base = unsafe {
            mmap_anonymous(
                None,
                nonzero(twice)?,
                ProtFlags::PROT_NONE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE,
            )
        }
        .map_err(|e| sys("reserving address space for a shared ring", e))?;
        let base: NonNull<u8> = base.cast();
        let mirror = Mirror { ptr: base, cap };
        for half in [0, cap] {
            let at =
                NonZeroUsize::new(base.as_ptr() as usize + half).expect("mmap never returns 0");
            // SAFETY:
            // - `base + half .. base + half + cap` lies inside the reservation made above, which
            //   this process owns and nothing else uses, so MAP_FIXED replaces only it.
            // - The file range is inside the sealed file (checked), so accesses cannot fault.
            unsafe {
                mmap(
                    Some(at),
                    nonzero(cap)?,
                    ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                    MapFlags::MAP_SHARED | MapFlags::MAP_FIXED | MapFlags::MAP_POPULATE,
                    file.fd(),
                    offset as i64,
                )
            }
            .map_err(|e| sys("mmap of a shared ring", e))?;
        }
        Ok(mirror)
    }

    /// The first byte of the first copy.
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Bytes of one copy.
    pub fn cap(&self) -> usize {
        self.cap
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        // SAFETY: the whole reservation, both copies, made by `new` and unmapped only here.
        let _ = unsafe { munmap(self.ptr.cast(), 2 * self.cap) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mirror_shows_the_same_bytes_twice() {
        let f = MemFile::create("test", 3 * PAGE, "CCL_TEST").unwrap();
        let m = Mirror::new(&f, PAGE, 2 * PAGE).unwrap();
        let p = m.ptr().as_ptr();
        // SAFETY: both copies are mapped read-write; this thread is the only user.
        unsafe {
            p.add(10).write(7);
            assert_eq!(p.add(2 * PAGE + 10).read(), 7);
            p.add(4 * PAGE - 1).write(9);
            assert_eq!(p.add(2 * PAGE - 1).read(), 9);
        }
        // Another mapping of the same file sees the writes.
        let again = Mapping::new(&f, PAGE, PAGE).unwrap();
        // SAFETY: mapped, and nothing writes it concurrently.
        assert_eq!(unsafe { again.ptr().as_ptr().add(10).read() }, 7);
    }

    #[test]
    fn ranges_outside_the_file_are_refused() {
        let f = MemFile::create("test", 2 * PAGE, "CCL_TEST").unwrap();
        assert!(Mapping::new(&f, PAGE, 2 * PAGE).is_err());
        assert!(Mapping::new(&f, 100, PAGE).is_err());
        assert!(Mirror::new(&f, 0, 3 * PAGE).is_err());
    }

    #[test]
    fn files_are_sealed_and_checked() {
        let f = MemFile::create("test", PAGE, "CCL_TEST").unwrap();
        // Sealed: it cannot shrink under a mapping.
        assert!(nix::unistd::ftruncate(f.fd(), 0).is_err());
        let dup: OwnedFd = f.fd().try_clone_to_owned().unwrap();
        assert!(
            MemFile::open(dup, 2 * PAGE)
                .unwrap_err()
                .to_string()
                .contains("expected")
        );
        // An unsealed file is refused.
        let raw = memfd_create(c"x", MemFdCreateFlag::MFD_CLOEXEC).unwrap();
        nix::unistd::ftruncate(&raw, PAGE as i64).unwrap();
        assert!(
            MemFile::open(raw, PAGE)
                .unwrap_err()
                .to_string()
                .contains("sealed")
        );
    }
}
