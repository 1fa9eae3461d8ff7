//! Allreduce algorithms (see [`crate::algo`] for the choice between them).

pub mod double_tree;
pub mod hd;
pub mod hier;
pub mod hier_shm;
pub mod rd;
pub mod ring;

use crate::schedule::{Action, Buf, Region, Schedule, Shape};

/// A world of one: the input is the result; out of place it is copied over.
fn alone(s: &Shape, mut sc: Schedule) -> Schedule {
    if !s.in_place && s.count > 0 {
        sc.push_auto(
            Action::Copy {
                src: Region::new(Buf::Send, 0, s.count),
                dst: Region::new(Buf::Recv, 0, s.count),
            },
            None,
            0,
        );
    }
    sc.finish()
}
