//! Prints the store's Redis function library, as `FUNCTION LOAD` takes it: for a server
//! loaded by hand, and for `benches/lua_profile.sh`.
//!
//! ```sh
//! cargo run -q --release -p redlimit-bench --example function_library > /tmp/library.lua
//! ```

fn main() {
    print!("{}", redlimit::RedisStore::function_library());
}
