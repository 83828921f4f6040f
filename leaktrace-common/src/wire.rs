//! [`wire_enum!`]: a `#[repr(u32)]` enum of wire kinds (a kernel counter's index, a map event's
//! kind) with its `TryFrom<u32>`, written once for each such enum.

/// Declare an enum whose variants carry their wire numbers (`Name = 3,`), and its
/// `TryFrom<u32>`: the variant numbered `v`, else `Err(ERROR(v))` (`ERROR` a tuple struct of the
/// `u32`, named after `else`). Attributes (docs, `#[repr(u32)]`, derives) pass through.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident else $err:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr, )+
        }
    ) => {
        $(#[$meta])*
        $vis enum $name {
            $( $(#[$vmeta])* $variant = $value, )+
        }

        impl TryFrom<u32> for $name {
            type Error = $err;

            /// The variant numbered `v`; Err for a number no variant has.
            fn try_from(v: u32) -> Result<Self, Self::Error> {
                $(
                    if v == $name::$variant as u32 {
                        return Ok($name::$variant);
                    }
                )+
                Err($err(v))
            }
        }
    };
}
