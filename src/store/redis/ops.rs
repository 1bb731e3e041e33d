//! Each call shape's round trip: the [`Store`], [`AdminStore`] and [`LeaseStore`]
//! impls build a [`Call`] of their shape, send it, and read its typed reply.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::batch;
use super::command::{Call, CallShape, GivingBack, Leasing, Run};
use super::contract::reply::{decode, Reply};
use super::contract::Op;
use super::keys;
use super::link::{self, Link};
use super::script;
use super::RedisStore;
use crate::algorithm;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::{StoreError, StoreErrorKind};
use crate::store::backend::{AdminStore, Backend, Operation, PolicySet};
use crate::store::lease::{GiveBack, GiveBackFuture, LeaseAsk, LeaseFuture, LeaseStore};
use crate::subject::Subject;

impl RedisStore {
    /// Connects now, loads the function library, and makes one call through it: the
    /// check to run at start.
    ///
    /// A store connects lazily, so without it a wrong `REDIS_URL` or a Redis that is
    /// down shows only when requests come, each decided by the failure mode; and the
    /// first check on a cold connection pays the connection, the library's load and
    /// its compilation within its timeout, which a loaded machine can run past. After
    /// `connect`, the first check is decided like any other.
    ///
    /// Fails within about 5 s with [`StoreErrorKind::Unavailable`] (or the kind of
    /// what failed) and an error that names the server's host and port, never the
    /// password. The store keeps working either way: it reconnects by itself.
    ///
    /// [`StoreErrorKind::Unavailable`]: crate::store::StoreErrorKind::Unavailable
    pub async fn connect(&self) -> Result<(), StoreError> {
        let mut lent = self.link.connect().await?;
        self.link.load_library_now(&mut lent).await?;
        // A peek, which writes nothing, of a policy that is valid by construction.
        let policy = crate::policy::Policy::fixed_window("ready", 1, Duration::from_secs(1))
            .map_err(|e| StoreError::new(StoreErrorKind::Protocol, e))?;
        let set = PolicySet::new(vec![policy]);
        let call = self.call(&Subject::new("~ready"), &set, 1, Run(Operation::Peek));
        let reply = self
            .link
            .exchange(&call, link::READY_TIMEOUT, None, 1)
            .await?;
        decode::<Reply>(reply)?.decision_of(Op::Run(Operation::Peek), &call.policies, call.cost)?;
        Ok(())
    }

    /// The Redis 7 function library every call goes through (`FCALL`), as
    /// `FUNCTION LOAD` takes it: for operators who load it ahead of time (the store
    /// loads it itself when a server lacks it) and benchmarks that call it bare.
    pub fn function_library() -> &'static str {
        script::Library::get().source()
    }

    pub(super) fn call<S: CallShape>(
        &self,
        subject: &Subject,
        set: &PolicySet,
        cost: u64,
        shape: S,
    ) -> Call<S> {
        Call {
            key_base: keys::key_base(&self.settings.prefix, subject, set),
            own_keys: set
                .is_scoped()
                .then(|| keys::scoped_keys(&self.settings.prefix, subject, set)),
            now_ms: self.settings.clock.as_ref().map(|c| c.now_ms()),
            cost,
            policies: Arc::clone(set.policies()),
            shape,
        }
    }

    /// The call of `op`: where the store turns an operation into its call, for
    /// [`AdminStore::run`] and the benches' commands alike. A charge of any size:
    /// more than its bound takes nothing more, and the Lua's numbers stay exact.
    pub(super) fn op_call(
        &self,
        op: Operation,
        subject: &Subject,
        set: &PolicySet,
        cost: u64,
    ) -> Call<Run> {
        let cost = match op {
            Operation::Charge => algorithm::charge_units(set.policies(), cost),
            _ => cost,
        };
        let mut call = self.call(subject, set, cost, Run(op));
        if matches!(op, Operation::Release | Operation::Renew) {
            // A holder's change names its in-flight policies' keys alone, and is
            // answered for them alone: the rate policies' states are not read.
            let (held, at) = set.held();
            call.policies = Arc::clone(held);
            call.own_keys = call
                .own_keys
                .map(|keys| at.iter().map(|&i| keys[i].clone()).collect());
        }
        call
    }

    /// Sends `call` on the store's connection within the timeout (see
    /// [`RedisStore::timeout`] for what it measures), and decodes its reply.
    fn send<S: CallShape>(
        &self,
        call: Call<S>,
    ) -> impl Future<Output = Result<(Call<S>, S::Reply), StoreError>> {
        let (link, timeout) = (Arc::clone(&self.link), self.settings.timeout);
        async move {
            let reply = decode(link.exchange(&call, timeout, None, 1).await?)?;
            Ok((call, reply))
        }
    }
}

impl Backend for RedisStore {
    /// One box per check (a second, for its round trip, when it goes at once):
    /// nothing beside a network round trip.
    type Future = batch::CheckFuture;

    /// A plain check goes at once while few calls are pipelined, else in the next
    /// batch (see [`RedisStore::max_batch`]).
    fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        let call = self.call(&subject, set, cost, Run(Operation::Check));
        let (link, settings) = (Arc::clone(&self.link), &self.settings);
        let (timeout, batching) = (settings.timeout, settings.batching);
        batch::check(link, call, timeout, batching)
    }

    fn is_cluster(&self) -> bool {
        self.link.is_cluster()
    }
}

/// Every operation is one `FCALL` of the same library and runs the check's
/// per-algorithm Lua. Those that batch with checks (a peek, a refund, a charge, a
/// release, a renewal: a request's settlement and its slot's release among them)
/// queue with them; a reset goes alone.
impl AdminStore for RedisStore {
    fn run(&self, op: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        let call = self.op_call(op, &subject, set, cost);
        let (link, settings) = (Arc::clone(&self.link), &self.settings);
        if Op::Run(op).entry().is_batch() {
            return batch::check(link, call, settings.timeout, settings.batching);
        }
        Box::pin(one(link, call, settings.timeout))
    }
}

/// One call alone, its decision. The round trip's future is made inside the box: one
/// made outside and moved in would be held twice.
async fn one<S: CallShape<Reply = Reply>>(
    link: Arc<Link>,
    call: Call<S>,
    timeout: Duration,
) -> Result<Decision, StoreError> {
    let reply: Reply = decode(link.exchange(&call, timeout, None, 1).await?)?;
    reply.decision_of(call.shape.op(), &call.policies, call.cost)
}

/// A leasing check is one `FCALL` of the library's lease function: the check's
/// decision, then the lease taken from the same states in the same call.
impl LeaseStore for RedisStore {
    fn check_leasing(
        &self,
        subject: Subject,
        set: &PolicySet,
        cost: u64,
        ask: LeaseAsk,
    ) -> LeaseFuture {
        let sent = self.send(self.call(&subject, set, cost, Leasing(ask)));
        Box::pin(async move {
            let (call, reply) = sent.await?;
            reply.decision(&call.policies, call.cost)
        })
    }

    fn give_back(&self, subject: Subject, set: &PolicySet, back: GiveBack) -> GiveBackFuture {
        let sent = self.send(self.call(&subject, set, back.units, GivingBack(back)));
        Box::pin(async move {
            let (call, reply) = sent.await?;
            reply.decision(&call.policies, call.cost)
        })
    }

    /// The client clock, if the store decides on one; else Redis `TIME`'s own.
    fn lease_clock(&self) -> Option<Arc<dyn Clock>> {
        self.settings.clock.clone()
    }
}
