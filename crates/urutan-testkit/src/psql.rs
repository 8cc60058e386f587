//! `psql` as the local PostgreSQL superuser (`postgres` on 127.0.0.1, the
//! server of `fixtures::PG_BASE` and `bench_env::PG_BASE`), for what the
//! tests and benchmarks do outside a pool: statements about databases and
//! roles, and a look at the server.

use std::process::Command;

/// The arguments of `psql` that run `sql` as the local superuser in
/// `database`: quiet, unaligned, tuples only (`-Atq`), so that the output
/// is just the rows' values, one line each.
pub fn superuser_args<'a>(database: &'a str, sql: &'a str) -> [&'a str; 9] {
    [
        "-Atq",
        "-h",
        "127.0.0.1",
        "-U",
        "postgres",
        "-d",
        database,
        "-c",
        sql,
    ]
}

/// A `psql` [`Command`] with [`superuser_args`], for callers that run it
/// their own way (a clean-up that ignores a failure).
pub fn superuser(database: &str, sql: &str) -> Command {
    let mut psql = Command::new("psql");
    psql.args(superuser_args(database, sql));
    psql
}
