//! The Lua scripts. Each touches only keys of one session (one hash tag, one cluster slot) and
//! judges leases by the server's clock (`TIME`), so replicas with skewed clocks agree.
//!
//! Scripts answer with integers or arrays, never error replies, so a refusal is data and every
//! error reply is a real failure.

use fred::types::scripts::Script;

/// Milliseconds since the epoch by the server's clock.
const NOW_MS: &str = "local function now_ms()\n\
  local t = redis.call('TIME')\n\
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n\
end\n";

/// Whether the activity hash holds a live lease, dropping expired ones as it reads.
const LIVE_ACTIVITY: &str = "local function live_activity(key, now)\n\
  local all = redis.call('HGETALL', key)\n\
  local live = 0\n\
  for i = 1, #all, 2 do\n\
    local ok, v = pcall(cjson.decode, all[i + 1])\n\
    if ok and type(v) == 'table' and tonumber(v.e) and tonumber(v.e) > now then\n\
      live = 1\n\
    else\n\
      redis.call('HDEL', key, all[i])\n\
    end\n\
  end\n\
  return live\n\
end\n";

/// All scripts, loaded once per client.
#[derive(Debug, Clone)]
pub(crate) struct Scripts {
    /// KEYS: value. ARGV: expected bytes, new bytes (empty = delete). 1 when swapped.
    pub(crate) cas: Script,
    /// KEYS: lock. ARGV: token, lease ms. 1 when renewed.
    pub(crate) renew: Script,
    /// KEYS: lock. ARGV: token. 1 when deleted.
    pub(crate) release: Script,
    /// KEYS: turn, rewind. ARGV: ttl ms. -1 when a rewind holds, else the new refcount.
    pub(crate) begin_turn: Script,
    /// KEYS: turn. 1 when a hold was released.
    pub(crate) end_turn: Script,
    /// KEYS: turn, activity. ARGV: ttl ms. {turn active, may rebuild, live activity}.
    pub(crate) turn_state: Script,
    /// KEYS: turn. ARGV: ttl ms. 1 when spent; never creates the lease.
    pub(crate) consume_rebuild: Script,
    /// KEYS: turn, rewind, activity. ARGV: token, ttl ms. 1 taken, 0 rewind held, -1 turn
    /// open, -2 background work live.
    pub(crate) lock_rewind: Script,
    /// KEYS: rewind. ARGV: token, ttl ms. 1 renewed, 2 re-acquired, 0 held by another.
    pub(crate) keep_rewind: Script,
    /// KEYS: activity. ARGV: id, kind, started_at, lease ms, cap. {1, 0} added or refreshed;
    /// {0, live of that kind} refused.
    pub(crate) add_activity: Script,
    /// KEYS: activity. ARGV: id, lease ms. 1 renewed, 0 not registered.
    pub(crate) renew_activity: Script,
    /// KEYS: activity. The live leases as a flat id, kind, started_at list.
    pub(crate) list_activities: Script,
    /// KEYS: binding, turn. ARGV: half the turn lease in ms. {binding or nil, 1 when a resolve
    /// would write to the turn lease (unspent rebuild, or past half its life)}. Writes nothing.
    pub(crate) read_for_resolve: Script,
}

impl Scripts {
    /// Every script, for loading.
    pub(crate) fn all(&self) -> [&Script; 13] {
        [
            &self.cas,
            &self.renew,
            &self.release,
            &self.begin_turn,
            &self.end_turn,
            &self.turn_state,
            &self.consume_rebuild,
            &self.lock_rewind,
            &self.keep_rewind,
            &self.add_activity,
            &self.renew_activity,
            &self.list_activities,
            &self.read_for_resolve,
        ]
    }

    pub(crate) fn new() -> Self {
        let cas = Script::from_lua(
            "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end\n\
             if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[2]) end\n\
             return 1",
        );
        let renew = Script::from_lua(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then\n\
               return redis.call('PEXPIRE', KEYS[1], ARGV[2])\n\
             end\n\
             return 0",
        );
        let release = Script::from_lua(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end\n\
             return 0",
        );
        let begin_turn = Script::from_lua(
            "if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end\n\
             local refs = redis.call('HINCRBY', KEYS[1], 'refs', 1)\n\
             if refs == 1 then redis.call('HSET', KEYS[1], 'rebuild', '1') end\n\
             redis.call('PEXPIRE', KEYS[1], ARGV[1])\n\
             return refs",
        );
        let end_turn = Script::from_lua(
            "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end\n\
             local refs = redis.call('HINCRBY', KEYS[1], 'refs', -1)\n\
             if refs <= 0 then redis.call('DEL', KEYS[1]) end\n\
             return 1",
        );
        let turn_state = Script::from_lua(format!(
            "{NOW_MS}{LIVE_ACTIVITY}\
             local refs = tonumber(redis.call('HGET', KEYS[1], 'refs') or '0') or 0\n\
             local active = 0\n\
             local rebuild = 0\n\
             if refs > 0 then\n\
               active = 1\n\
               if redis.call('HGET', KEYS[1], 'rebuild') == '1' then rebuild = 1 end\n\
               redis.call('PEXPIRE', KEYS[1], ARGV[1])\n\
             end\n\
             return {{active, rebuild, live_activity(KEYS[2], now_ms())}}"
        ));
        let consume_rebuild = Script::from_lua(
            "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end\n\
             redis.call('HSET', KEYS[1], 'rebuild', '0')\n\
             redis.call('PEXPIRE', KEYS[1], ARGV[1])\n\
             return 1",
        );
        let lock_rewind = Script::from_lua(format!(
            "{NOW_MS}{LIVE_ACTIVITY}\
             if (tonumber(redis.call('HGET', KEYS[1], 'refs') or '0') or 0) > 0 then return -1 end\n\
             if live_activity(KEYS[3], now_ms()) == 1 then return -2 end\n\
             if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end\n\
             return 0"
        ));
        let keep_rewind = Script::from_lua(
            "local held = redis.call('GET', KEYS[1])\n\
             if held == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end\n\
             if not held then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 2 end\n\
             return 0",
        );
        let add_activity = Script::from_lua(format!(
            "{NOW_MS}\
             local now = now_ms()\n\
             local all = redis.call('HGETALL', KEYS[1])\n\
             local same, latest, exists = 0, 0, false\n\
             for i = 1, #all, 2 do\n\
               local ok, v = pcall(cjson.decode, all[i + 1])\n\
               if ok and type(v) == 'table' and tonumber(v.e) and tonumber(v.e) > now then\n\
                 if all[i] == ARGV[1] then exists = true\n\
                 elseif v.k == ARGV[2] then same = same + 1 end\n\
                 if tonumber(v.e) > latest then latest = tonumber(v.e) end\n\
               else\n\
                 redis.call('HDEL', KEYS[1], all[i])\n\
               end\n\
             end\n\
             if not exists and same >= tonumber(ARGV[5]) then return {{0, same}} end\n\
             local e = now + tonumber(ARGV[4])\n\
             redis.call('HSET', KEYS[1], ARGV[1], cjson.encode({{k = ARGV[2], s = ARGV[3], e = e}}))\n\
             if e > latest then latest = e end\n\
             redis.call('PEXPIREAT', KEYS[1], latest)\n\
             return {{1, 0}}"
        ));
        let renew_activity = Script::from_lua(format!(
            "{NOW_MS}\
             local now = now_ms()\n\
             local raw = redis.call('HGET', KEYS[1], ARGV[1])\n\
             if not raw then return 0 end\n\
             local ok, v = pcall(cjson.decode, raw)\n\
             if not ok or type(v) ~= 'table' or not tonumber(v.e) or tonumber(v.e) <= now then\n\
               redis.call('HDEL', KEYS[1], ARGV[1])\n\
               return 0\n\
             end\n\
             v.e = now + tonumber(ARGV[2])\n\
             redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(v))\n\
             if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end\n\
             return 1"
        ));
        let list_activities = Script::from_lua(format!(
            "{NOW_MS}\
             local now = now_ms()\n\
             local all = redis.call('HGETALL', KEYS[1])\n\
             local out = {{}}\n\
             for i = 1, #all, 2 do\n\
               local ok, v = pcall(cjson.decode, all[i + 1])\n\
               if ok and type(v) == 'table' and tonumber(v.e) and tonumber(v.e) > now then\n\
                 table.insert(out, all[i])\n\
                 table.insert(out, tostring(v.k))\n\
                 table.insert(out, tostring(v.s))\n\
               end\n\
             end\n\
             return out"
        ));
        let read_for_resolve = Script::from_lua(
            "local b = redis.call('GET', KEYS[1])\n\
             local r = redis.call('HGET', KEYS[2], 'rebuild')\n\
             local due = 0\n\
             if r == '1' then due = 1\n\
             elseif r then\n\
               local ttl = redis.call('PTTL', KEYS[2])\n\
               if ttl >= 0 and ttl < tonumber(ARGV[1]) then due = 1 end\n\
             end\n\
             return {b, due}",
        );
        Scripts {
            read_for_resolve,
            cas,
            renew,
            release,
            begin_turn,
            end_turn,
            turn_state,
            consume_rebuild,
            lock_rewind,
            keep_rewind,
            add_activity,
            renew_activity,
            list_activities,
        }
    }
}
