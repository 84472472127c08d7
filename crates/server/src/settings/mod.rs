//! Settings from outside the API: the files a server follows (`--config`, `--import`; what the
//! options name in `followed`, how they are followed in `files`) and the imports
//! of other systems' configurations (envoyproxy/ratelimit, Limitador, YAML), from a file
//! followed or sent through the admin API (`import_call`). Each becomes changes the
//! controller applies like any other.

pub mod files;
pub(crate) mod followed;
pub mod import;
pub(crate) mod import_call;
