//! `list_job_runs` by job type and by scope, on both stores: a walk that
//! checks rows one by one stops at its budget and the next page goes on
//! where it stopped, every match once; the scope's index; the tenant gate.
//! The PostgreSQL cases need a server (`JOBFORGE_PG_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`); without one they print why
//! and pass, unless `JOBFORGE_REQUIRE_PG=1` makes that a failure.

use jobforge_core::engine::{JobRunQuery, PAGE_WALK_BUDGET};
use jobforge_core::store::postgres::{PgConfig, PgStore};
use jobforge_core::*;
use serde_json::value::RawValue;

fn options(multi_tenant: bool) -> EngineOptions {
    EngineOptions {
        multi_tenant,
        clock: ClockKind::Manual,
        retention: Default::default(),
    }
}

fn memory(multi_tenant: bool) -> Engine<MemoryStore> {
    Engine::new(MemoryStore::new(), options(multi_tenant))
}

/// A test's schema, dropped when the test ends.
struct Schema {
    url: String,
    name: String,
}

impl Drop for Schema {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.url, postgres::NoTls) {
            // Best effort: a schema left behind is dropped by the next run.
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.name));
        }
    }
}

/// An engine on a fresh schema, or None (skip) without a server.
fn postgres(tag: &str, multi_tenant: bool) -> Option<(Engine<PgStore>, Schema)> {
    let url = std::env::var("JOBFORGE_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let schema = format!("jf_rs_pages_{tag}_{}", std::process::id());
    let mut cfg = PgConfig::new(url);
    cfg.schema = schema.clone();
    cfg.max_connections = 2;
    match postgres::Client::connect(&cfg.url, postgres::NoTls) {
        Ok(mut c) => c
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
            .unwrap(),
        Err(e) => {
            if std::env::var("JOBFORGE_REQUIRE_PG").is_ok_and(|v| v == "1") {
                panic!("JOBFORGE_REQUIRE_PG=1 but PostgreSQL is unreachable: {e}");
            }
            eprintln!("skipping postgres test: no server at JOBFORGE_PG_URL ({e})");
            return None;
        }
    }
    let schema = Schema {
        url: cfg.url.clone(),
        name: schema,
    };
    let store = PgStore::new(cfg).unwrap();
    store.migrate().unwrap();
    Some((Engine::new(store, options(multi_tenant)), schema))
}

fn raw(s: &str) -> Box<RawValue> {
    RawValue::from_string(s.to_owned()).unwrap()
}

fn req(t: &str) -> StartRequest {
    StartRequest {
        job_type: t.to_owned(),
        input: raw("{}"),
        ..StartRequest::default()
    }
}

fn scoped(t: &str, id: &str) -> StartRequest {
    StartRequest {
        scope: Some(("acct".to_owned(), id.to_owned())),
        ..req(t)
    }
}

fn register<S: Store>(e: &Engine<S>, types: &[&str]) {
    for t in types {
        e.register(DefinitionSpec {
            job_type: (*t).to_owned(),
            ..DefinitionSpec::default()
        })
        .unwrap();
    }
}

/// Starts `n` runs of `t` in batches (each one transaction).
fn start_n<S: Store>(e: &Engine<S>, n: usize, make: impl Fn(usize) -> StartRequest) -> Vec<RunRow> {
    let mut out = Vec::with_capacity(n);
    let mut i = 0;
    while i < n {
        let k = (n - i).min(2_000);
        out.extend(e.start_many((i..i + k).map(&make).collect()).unwrap());
        i += k;
    }
    out
}

/// Every page of a walk: each page's rows and whether it had a next cursor.
fn pages<S: Store>(e: &Engine<S>, tenant: &TenantArg, q: JobRunQuery) -> Vec<(Vec<RunId>, bool)> {
    let mut q = q;
    let mut out = Vec::new();
    for _ in 0..1_000 {
        let (rows, next) = e.list_job_runs(tenant, &q).unwrap();
        assert!(rows.len() <= q.limit, "a page longer than its limit");
        out.push((rows.iter().map(|r| r.id).collect(), next.is_some()));
        match next {
            Some(c) => q.cursor = Some(c),
            None => return out,
        }
    }
    panic!("paging does not end");
}

fn newest_first(rows: &[&RunRow]) -> Vec<RunId> {
    let mut v: Vec<&RunRow> = rows.to_vec();
    v.sort_by_key(|r| std::cmp::Reverse((r.created_at, r.id.as_u128())));
    v.iter().map(|r| r.id).collect()
}

/// Two rare runs newest, then more common ones than a walk's budget, then
/// three rare ones oldest: the first page of the rare type runs out of its
/// budget with 2 of its 4 rows and a cursor; the next one finds the rest.
fn type_walk_stops_at_its_budget<S: Store>(e: &Engine<S>) {
    register(e, &["rare", "common", "other"]);
    let old: Vec<RunRow> = start_n(e, 3, |_| req("rare"));
    e.advance_time(1);
    start_n(e, PAGE_WALK_BUDGET + 500, |_| req("common"));
    e.advance_time(1);
    let new: Vec<RunRow> = start_n(e, 2, |_| req("rare"));
    let rare: Vec<&RunRow> = old.iter().chain(&new).collect();
    let q = JobRunQuery {
        job_type: Some("rare".to_owned()),
        limit: 4,
        ..JobRunQuery::default()
    };
    let got = pages(e, &TenantArg::Missing, q.clone());
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].0.len(), 2, "the budget ran out on the common runs");
    assert!(got[0].1, "a short page with a cursor");
    assert_eq!(got[1].0.len(), 3);
    assert!(!got[1].1);
    let all: Vec<RunId> = got.iter().flat_map(|p| p.0.clone()).collect();
    assert_eq!(
        all,
        newest_first(&rare),
        "every rare run once, newest first"
    );

    // A type none of the runs has: empty pages with cursors, then the end.
    let got = pages(
        e,
        &TenantArg::Missing,
        JobRunQuery {
            job_type: Some("other".to_owned()),
            ..q.clone()
        },
    );
    assert!(got.iter().all(|p| p.0.is_empty()));
    assert_eq!(got.len(), 2, "{} examined per page", PAGE_WALK_BUDGET);

    // With a status: only that status's runs of the type come out. (The
    // walk may count only that status's runs, as memory's per-status sets
    // do, or every run of the tenant, as PostgreSQL's index does: then
    // the rows come over more pages, each walk still bounded.)
    e.cancel(&old[1].id.to_string(), false, &TenantArg::Missing)
        .unwrap();
    let got = pages(
        e,
        &TenantArg::Missing,
        JobRunQuery {
            statuses: Some(vec![RunStatus::Canceled]),
            ..q.clone()
        },
    );
    let all: Vec<RunId> = got.iter().flat_map(|p| p.0.clone()).collect();
    assert_eq!(all, vec![old[1].id]);
    assert!(got.len() <= 2, "{got:?}");
    let got = pages(
        e,
        &TenantArg::Missing,
        JobRunQuery {
            statuses: Some(vec![RunStatus::Pending]),
            limit: 1,
            ..q.clone()
        },
    );
    let all: Vec<RunId> = got.iter().flat_map(|p| p.0.clone()).collect();
    let pending: Vec<&RunRow> = rare.iter().copied().filter(|r| r.id != old[1].id).collect();
    assert_eq!(all, newest_first(&pending));
}

#[test]
fn memory_type_walk_stops_at_its_budget() {
    let e = memory(false);
    type_walk_stops_at_its_budget(&e);
    e.store().verify_indexes().unwrap();
}

#[test]
fn postgres_type_walk_stops_at_its_budget() {
    let Some((e, _schema)) = postgres("budget", false) else {
        return;
    };
    type_walk_stops_at_its_budget(&e);
}

/// Exactly a budget of rows and none matching: one empty page, no cursor
/// (the walk saw the index end).
fn walk_of_exactly_its_budget_ends<S: Store>(e: &Engine<S>) {
    register(e, &["common"]);
    start_n(e, PAGE_WALK_BUDGET, |_| req("common"));
    let (rows, next) = e
        .list_job_runs(
            &TenantArg::Missing,
            &JobRunQuery {
                job_type: Some("rare".to_owned()),
                limit: 10,
                ..JobRunQuery::default()
            },
        )
        .unwrap();
    assert!(rows.is_empty());
    assert_eq!(next, None);
}

#[test]
fn memory_walk_of_exactly_its_budget_ends() {
    walk_of_exactly_its_budget_ends(&memory(false));
}

#[test]
fn postgres_walk_of_exactly_its_budget_ends() {
    let Some((e, _schema)) = postgres("exact", false) else {
        return;
    };
    walk_of_exactly_its_budget_ends(&e);
}

/// A scope's runs through its index, in pages across runs of one
/// millisecond (ordered by id), with a type and a status, and a scope of
/// another tenant or none.
fn scope_pages<S: Store>(e: &Engine<S>) {
    register(e, &["a", "b"]);
    let t = |s: &str| TenantArg::Id(s.to_owned());
    let mut mine: Vec<RunRow> = Vec::new();
    for round in 0..4 {
        for (i, id) in ["1", "2", "1", "1"].iter().enumerate() {
            let ty = if (round + i) % 3 == 0 { "b" } else { "a" };
            let r = e
                .start(StartRequest {
                    tenant: t("x"),
                    ..scoped(ty, id)
                })
                .unwrap();
            mine.push(r);
        }
        // The other tenant's runs of the same scope.
        e.start(StartRequest {
            tenant: t("y"),
            ..scoped("a", "1")
        })
        .unwrap();
        if round % 2 == 1 {
            e.advance_time(1);
        }
    }
    e.start(StartRequest {
        tenant: t("x"),
        ..req("a")
    })
    .unwrap();
    let scope1: Vec<&RunRow> = mine
        .iter()
        .filter(|r| r.scope_entity_id() == Some("1"))
        .collect();
    let scope = Some(("acct".to_owned(), "1".to_owned()));
    for limit in [1, 2, 5, 50] {
        let got = pages(
            e,
            &t("x"),
            JobRunQuery {
                scope: scope.clone(),
                limit,
                ..JobRunQuery::default()
            },
        );
        let all: Vec<RunId> = got.iter().flat_map(|p| p.0.clone()).collect();
        assert_eq!(all, newest_first(&scope1), "pages of {limit}");
        assert!(got[..got.len() - 1].iter().all(|p| p.0.len() == limit));
    }
    let of_b: Vec<&RunRow> = scope1
        .iter()
        .copied()
        .filter(|r| &*r.job_type == "b")
        .collect();
    assert!(!of_b.is_empty());
    let got = pages(
        e,
        &t("x"),
        JobRunQuery {
            scope: scope.clone(),
            job_type: Some("b".to_owned()),
            statuses: Some(vec![RunStatus::Pending]),
            limit: 2,
            ..JobRunQuery::default()
        },
    );
    let all: Vec<RunId> = got.iter().flat_map(|p| p.0.clone()).collect();
    assert_eq!(all, newest_first(&of_b));
    let (rows, next) = e
        .list_job_runs(
            &t("z"),
            &JobRunQuery {
                scope: scope.clone(),
                limit: 50,
                ..JobRunQuery::default()
            },
        )
        .unwrap();
    assert!(rows.is_empty() && next.is_none(), "another tenant's scope");
    let (rows, _) = e
        .list_job_runs(
            &t("y"),
            &JobRunQuery {
                scope: scope.clone(),
                limit: 50,
                ..JobRunQuery::default()
            },
        )
        .unwrap();
    assert_eq!(rows.len(), 4, "tenant y sees its own runs of the scope");
    let err = e
        .list_job_runs(
            &TenantArg::Missing,
            &JobRunQuery {
                scope,
                job_type: Some("a".to_owned()),
                ..JobRunQuery::default()
            },
        )
        .unwrap_err();
    assert!(matches!(err, JobError::MissingTenantId { .. }), "{err:?}");
}

#[test]
fn memory_scope_pages() {
    let e = memory(true);
    scope_pages(&e);
    e.store().verify_indexes().unwrap();
}

#[test]
fn postgres_scope_pages() {
    let Some((e, _schema)) = postgres("scope", true) else {
        return;
    };
    scope_pages(&e);
}

/// A scope with more runs than a walk's budget, the matches oldest: every
/// match once whatever the store's pages look like.
fn big_scope_finds_every_match<S: Store>(e: &Engine<S>) {
    register(e, &["rare", "common"]);
    let rare = start_n(e, 3, |_| scoped("rare", "9"));
    e.advance_time(1);
    start_n(e, PAGE_WALK_BUDGET + 10, |_| scoped("common", "9"));
    let got = pages(
        e,
        &TenantArg::Missing,
        JobRunQuery {
            scope: Some(("acct".to_owned(), "9".to_owned())),
            job_type: Some("rare".to_owned()),
            limit: 2,
            ..JobRunQuery::default()
        },
    );
    let all: Vec<RunId> = got.iter().flat_map(|p| p.0.clone()).collect();
    assert_eq!(all, newest_first(&rare.iter().collect::<Vec<_>>()));
    // The walk of the scope's runs is bounded: the first page ran out of
    // its budget on the common runs, found nothing, and says where it
    // stopped.
    assert!(got[0].0.is_empty() && got[0].1, "{got:?}");
}

#[test]
fn memory_big_scope_finds_every_match() {
    let e = memory(false);
    big_scope_finds_every_match(&e);
}

#[test]
fn postgres_big_scope_finds_every_match() {
    let Some((e, _schema)) = postgres("bigscope", false) else {
        return;
    };
    big_scope_finds_every_match(&e);
}

/// A run whose creation time is earlier than the scope's newest (a JS-side
/// start behind a wall clock that stepped back) takes its place in the
/// scope's list: pages stay in order.
#[test]
fn memory_scope_list_keeps_created_order() {
    let e = memory(false);
    register(&e, &["a"]);
    e.advance_time(10_000);
    let now = e.now();
    let late = e.start(scoped("a", "1")).unwrap();
    // Buffered starts carry their own time.
    let (early, earliest) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let at = |id, ms| {
        BufferedStart::WithOptions(Box::new(StartRequest {
            preset: Some((id, ms)),
            ..scoped("a", "1")
        }))
    };
    let (failed, _) = e
        .start_batch([at(early, now - 5_000), at(earliest, now - 9_000)], false)
        .unwrap();
    assert!(failed.is_empty(), "{failed:?}");
    e.store().verify_indexes().unwrap();
    let got = pages(
        &e,
        &TenantArg::Missing,
        JobRunQuery {
            scope: Some(("acct".to_owned(), "1".to_owned())),
            limit: 1,
            ..JobRunQuery::default()
        },
    );
    let all: Vec<RunId> = got.iter().flat_map(|p| p.0.clone()).collect();
    assert_eq!(all, vec![late.id, early, earliest]);
}
