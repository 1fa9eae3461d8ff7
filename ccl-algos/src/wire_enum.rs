//! Enums that travel on the wire as numbers.

/// Declares an enum that travels on the wire as a number. One list gives every variant its fixed
/// id and its name, and from it come `ALL` (in id order), `id`, `from_id` and `name`, so no
/// variant can be missing from any of them. Ids are compared between ranks in operation headers:
/// never reuse or change one.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $id:literal => $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum $name {
            $( $(#[$vmeta])* $variant = $id, )+
        }

        impl $name {
            /// Every variant, in id order.
            pub const ALL: [$name; [$($id),+].len()] = [$($name::$variant),+];

            /// Its number in operation headers.
            pub const fn id(self) -> u8 {
                self as u8
            }

            /// The variant whose number is `id`, if any.
            pub const fn from_id(id: u8) -> Option<$name> {
                match id {
                    $( $id => Some($name::$variant), )+
                    _ => None,
                }
            }

            /// The name used by `CCL_ALGO`, logs and the benchmark.
            pub const fn name(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }
        }

        // Ids count 0, 1, 2, ... in the order listed, so `ALL[id]` is the variant of `id`.
        const _: () = {
            let mut i = 0;
            while i < $name::ALL.len() {
                assert!($name::ALL[i] as usize == i, "ids must be 0, 1, 2, ... in order");
                i += 1;
            }
        };
    };
}
