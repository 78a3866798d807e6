// A worker for the fencecheck worker contract v2: a small starting point.
//
// Written by `fencecheck init-worker --lang go DIR`. It implements the
// contract (docs/worker-contract.md of fencecheck) in the simplest way that
// is still correct: the command line (section 1), the injection-point
// client (section 3), the event history (section 4), every required `ops`
// operation (section 5), the schema (schema.sql, sections 6 and 7) and the
// protocol as SQL functions (protocol.sql), and the `run` workflow (section
// 10). It keeps the same things simple as the Python template (README.md).
//
// Build: go build -o worker .   Run: ./worker migrate | ops | run [...]
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

//go:embed schema.sql protocol.sql
var migrations embed.FS

const schemaVersion = 2 // the version of the checkpoint state this worker writes

var (
	workerID                     = envOr("FENCECHECK_WORKER_ID", "worker")
	tenant                       = os.Getenv("FENCECHECK_TENANT")
	owner                        = fmt.Sprintf("%s/%x", workerID, rand.Int63())
	leaseTTL                     = envMS("FENCECHECK_LEASE_TTL_MS", 5000)
	heartbeatMS                  = envMS("FENCECHECK_HEARTBEAT_MS", 1000)
	heartbeatTO                  = envMS("FENCECHECK_HEARTBEAT_TIMEOUT_MS", 1000)
	dispatchTTL                  = envMS("FENCECHECK_DISPATCH_TTL_MS", 5000)
	retryWrite                   = 30 * time.Second // how long a write whose connection broke is retried
	toolURL                      = strings.TrimRight(os.Getenv("FENCECHECK_TOOL_URL"), "/")
	brokerURL                    = strings.TrimRight(os.Getenv("FENCECHECK_BROKER_URL"), "/")
	httpClient                   = &http.Client{Timeout: time.Duration(envMS("FENCECHECK_TOOL_TIMEOUT_MS", 3000)) * time.Millisecond}
	sensitive                    = []string{"customer_token", "payment_token", "card_number", "customer_email"}
	bg                           = context.Background()
	capabilities                 = map[string]string{}
	idempotencyRetentionMS int64 = -1
	capabilitiesM          sync.Mutex
)

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// settingErrors are the settings refused at start (section 2, experiment X).
var settingErrors []string

func envMS(name string, def int64) int64 {
	raw := os.Getenv(name)
	if raw == "" {
		return def
	}
	v, err := strconv.ParseInt(raw, 10, 64)
	if err != nil { // "10s" is no duration here: never read as a default or as 10
		settingErrors = append(settingErrors, fmt.Sprintf("%s=%q is not whole milliseconds", name, raw))
		return def
	}
	return v
}

// settingsRefused says what is wrong with the lease settings: the protocol forbids them.
func settingsRefused() []string {
	wrong := append([]string{}, settingErrors...)
	for name, v := range map[string]int64{"FENCECHECK_LEASE_TTL_MS": leaseTTL, "FENCECHECK_HEARTBEAT_MS": heartbeatMS,
		"FENCECHECK_HEARTBEAT_TIMEOUT_MS": heartbeatTO, "FENCECHECK_DISPATCH_TTL_MS": dispatchTTL} {
		if v <= 0 {
			wrong = append(wrong, fmt.Sprintf("%s must be > 0 ms, not %d", name, v))
		}
	}
	if heartbeatMS >= leaseTTL {
		wrong = append(wrong, "the heartbeat interval must be shorter than the lease")
	}
	switch os.Getenv("FENCECHECK_REQUIRE_DURABILITY") {
	case "", "none", "async", "sync":
	default:
		wrong = append(wrong, "FENCECHECK_REQUIRE_DURABILITY must be none, async or sync")
	}
	return wrong
}

func logf(msg string, fields ...any) {
	line := map[string]any{"msg": msg, "worker": workerID}
	for i := 0; i+1 < len(fields); i += 2 {
		line[fmt.Sprint(fields[i])] = fields[i+1]
	}
	b, _ := json.Marshal(line)
	fmt.Fprintln(os.Stderr, string(b))
}

// ------------------------------------------------------------ errors (section 5)

// Refusal is a refusal the contract names; Class is the reply's `error`.
type Refusal struct{ Class, Message string }

func (r *Refusal) Error() string { return r.Class + ": " + r.Message }

func refuse(class, format string, args ...any) error {
	return &Refusal{class, fmt.Sprintf(format, args...)}
}

// The SQLSTATEs protocol.sql raises, and the database's own refusals.
var sqlstates = map[string]string{
	"FC001": "LeaseLost", "FC002": "RevisionConflict", "FC003": "RunNotFound", "FC004": "TaskExists",
	"FC005": "RunNotRetryable", "FC006": "LedgerConflict", "23505": "IntentConflict",
	"42501": "InsufficientPrivilege",
}

// classify names an error and says whether it definitely changed nothing.
func classify(err error) (class string, definite bool) {
	var r *Refusal
	if errors.As(err, &r) {
		return r.Class, r.Class != "CommitOutcomeUnknown"
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		if name, ok := sqlstates[pg.Code]; ok {
			return name, true
		}
		return "DatabaseError", true
	}
	return "ConnectionError", false // it may have happened
}

// ------------------------------------------------------------ injection points (section 3)

// point tells the harness we reached `name` and obeys its one-line answer.
func point(name, runID string, epoch, revision int64, opID string) {
	path := os.Getenv("FENCECHECK_CONTROL")
	if path == "" {
		return
	}
	req, _ := json.Marshal(map[string]any{"v": 1, "type": "point", "point": name, "worker": workerID,
		"pid": os.Getpid(), "run_id": nullable(runID), "epoch": epoch, "revision": nonZero(revision),
		"operation_id": nullable(opID)})
	conn, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		logf("control socket unusable; continuing", "point", name, "error", err.Error())
		return
	}
	defer conn.Close()
	var answer struct {
		Action string `json:"action"`
		MS     int64  `json:"ms"`
	}
	_, err = conn.Write(append(req, '\n'))
	if err == nil { // a hold is the harness not answering yet: no timeout here
		var line []byte
		line, err = bufio.NewReader(conn).ReadBytes('\n')
		if err == nil {
			err = json.Unmarshal(line, &answer)
		}
	}
	if err != nil {
		logf("control socket unusable; continuing", "point", name, "error", err.Error())
		return
	}
	switch answer.Action {
	case "crash":
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	case "delay":
		time.Sleep(time.Duration(answer.MS) * time.Millisecond)
	}
}

func nonZero(n int64) any {
	if n == 0 {
		return nil
	}
	return n
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// ------------------------------------------------------------ event history (section 4)

var (
	historyM  sync.Mutex
	historyFD = -1
)

// Ids are the identities a history line carries (run_id, epoch, revision,
// operation_id, event_id); an operation adds what it learnt on the way.
type Ids map[string]any

func record(kind, op string, ids Ids, errClass string) {
	path := os.Getenv("FENCECHECK_EVENTS")
	if path == "" {
		return
	}
	line := map[string]any{"time": float64(time.Now().UnixMicro()) / 1e6, "worker": workerID,
		"pid": os.Getpid(), "type": kind, "op": op, "error": nullable(errClass), "detail": map[string]any{}}
	for _, k := range []string{"run_id", "epoch", "revision", "operation_id", "event_id"} {
		line[k] = ids[k]
		if s, ok := ids[k].(string); ok && s == "" {
			line[k] = nil
		}
	}
	b, _ := json.Marshal(line)
	historyM.Lock()
	defer historyM.Unlock()
	if historyFD < 0 {
		fd, err := syscall.Open(path, syscall.O_WRONLY|syscall.O_APPEND|syscall.O_CREAT, 0o644)
		if err != nil {
			return
		}
		historyFD = fd
	}
	_, _ = syscall.Write(historyFD, append(b, '\n')) // one write per line, O_APPEND
}

// recorded runs fn between an `invoke` line and its outcome: ok, fail
// (definitely not done) or info (outcome unknown).
func recorded(op string, ids Ids, fn func(Ids) error) error {
	record("invoke", op, ids, "")
	err := fn(ids)
	if err == nil {
		record("ok", op, ids, "")
	} else if class, definite := classify(err); definite {
		record("fail", op, ids, class)
	} else {
		record("info", op, ids, class)
	}
	return err
}

// ------------------------------------------------------------ database

// Db is one connection, made again when it broke.
type Db struct {
	dsn               string
	conn              *pgx.Conn
	syncWaitCancelled atomic.Bool
}

func (d *Db) c() (*pgx.Conn, error) {
	if d.conn != nil && !d.conn.IsClosed() {
		return d.conn, nil
	}
	cfg, err := pgx.ParseConfig(d.dsn)
	if err != nil {
		return nil, err
	}
	cfg.ConnectTimeout = 5 * time.Second
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		// A COMMIT answered while its wait for the synchronous standby was
		// cancelled is committed locally but not known to be durable.
		if strings.Contains(n.Message, "synchronous replication") {
			d.syncWaitCancelled.Store(true)
		}
	}
	d.conn, err = pgx.ConnectConfig(bg, cfg)
	return d.conn, err
}

// rows runs a query and returns its rows as maps (column name -> value).
func (d *Db) rows(ctx context.Context, sql string, args ...any) ([]map[string]any, error) {
	conn, err := d.c()
	if err != nil {
		return nil, err
	}
	r, err := conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(r, pgx.RowToMap)
}

// one returns the first row, or nil.
func (d *Db) one(sql string, args ...any) (map[string]any, error) {
	rows, err := d.rows(bg, sql, args...)
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	return rows[0], nil
}

func canonical(v any) []byte {
	// encoding/json sorts map keys and adds no spaces; it would escape <, > and &
	// where canonical JSON (section 6) keeps them.
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

func sha(v any) []byte { s := sha256.Sum256(canonical(v)); return s[:] }

func num(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case int32:
		return int64(n)
	case float64:
		return int64(n)
	case json.Number:
		i, _ := n.Int64()
		return i
	}
	return 0
}

func str(v any) string {
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}

// Lease is the identity every call under one lease passes.
type Lease struct {
	RunID, Owner string
	Epoch        int64
}

// claimColumns are the grant's columns as JSON-friendly types.
const claimColumns = "run_id::text, epoch, revision, status, owner, lease_expires_at::text, input"

func claim(d *Db, who, runID string) (map[string]any, error) {
	return d.one("SELECT "+claimColumns+" FROM fencecheck.claim($1, $2, $3::uuid)",
		who, leaseTTL, nullable(runID))
}

func latestCheckpoint(d *Db, runID string) (map[string]any, error) {
	return d.one("SELECT revision, state_json, schema_version, state_hash FROM agent_checkpoints"+
		" WHERE run_id = $1::uuid ORDER BY revision DESC LIMIT 1", runID)
}

// Write is one protected write's content (section 6); Intent registers the
// ledger row, Result records the operation's final status, DelayMS requeues.
type Write struct {
	State               map[string]any
	Step, Status, Event string
	EventID             string
	SchemaVersion       int64
	Intent, Result      map[string]any
	DelayMS             *int64
}

func orNil(m map[string]any) any {
	if m == nil {
		return nil
	}
	return m
}

// protectedWrite commits one protected write in an explicit transaction with
// its two injection points and returns the new revision.
//
// A connection lost on the way is read back by event id: committed, or the
// same write is sent again (its event id and the revision check make a
// second commit impossible), for up to retryWrite. CommitOutcomeUnknown when
// that cannot settle it, or when the COMMIT was answered with its wait for
// the synchronous standby cancelled (committed here, not known to be durable).
func protectedWrite(d *Db, l Lease, expected int64, w Write) (int64, error) {
	payload := map[string]any{"tenant_id": tenant, "run_id": l.RunID, "epoch": l.Epoch, "step": w.Step}
	giveUpAt := time.Now().Add(retryWrite)
	for attempt := 0; ; attempt++ {
		d.syncWaitCancelled.Store(false)
		var revision int64
		conn, err := d.c()
		if err == nil {
			err = pgx.BeginFunc(bg, conn, func(tx pgx.Tx) error {
				if _, err := tx.Exec(bg, "SELECT fencecheck.lock_lease($1::uuid, $2, $3)", l.RunID, l.Owner, l.Epoch); err != nil {
					return err
				}
				point("after_lease_row_locked", l.RunID, l.Epoch, expected, "")
				err := tx.QueryRow(bg, "SELECT fencecheck.protected_write($1::uuid, $2, $3, $4, $5, $6, $7, $8::uuid,"+
					" $9, $10, $11, $12, $13, $14, $15)",
					l.RunID, l.Owner, l.Epoch, expected, w.State, sha(w.State), w.SchemaVersion, w.EventID,
					nullable(w.Step), nullable(w.Status), w.Event, payload, orNil(w.Intent), orNil(w.Result), w.DelayMS,
				).Scan(&revision)
				if err != nil {
					return err
				}
				point("before_commit", l.RunID, l.Epoch, expected, "")
				return nil
			})
		}
		var pg *pgconn.PgError
		switch {
		case err == nil && d.syncWaitCancelled.Load():
			return 0, refuse("CommitOutcomeUnknown", "the wait for the synchronous standby was cancelled")
		case err == nil:
			return revision, nil
		case !errors.As(err, &pg): // the connection broke: did it commit?
			if found := readBack(d.dsn, w.EventID); found > 0 {
				return found, nil
			}
			if time.Now().After(giveUpAt) {
				return 0, refuse("CommitOutcomeUnknown", "event %s not committed so far", w.EventID)
			}
			time.Sleep(200 * time.Millisecond)
		default: // refused; after a retry, our earlier COMMIT may have gone through after all
			if found := readBack(d.dsn, w.EventID); attempt > 0 && found > 0 {
				return found, nil
			}
			return 0, toRefusal(err)
		}
	}
}

// readBack is the revision the write with this event id committed, or 0.
func readBack(dsn, eventID string) int64 {
	found, err := (&Db{dsn: dsn}).one("SELECT revision FROM agent_checkpoints WHERE event_id = $1::uuid", eventID)
	if err != nil || found == nil {
		return 0
	}
	return num(found["revision"])
}

// toRefusal turns a database refusal of protocol.sql into its contract name.
func toRefusal(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		if name, ok := sqlstates[pg.Code]; ok {
			return &Refusal{name, pg.Message}
		}
	}
	return err
}

func newEventID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// ------------------------------------------------------------ the tool and the broker

// call sends one HTTP request; the status and the JSON answer, or an error
// when there is no answer.
func call(method, u string, body any) (int, map[string]any, error) {
	var rd *strings.Reader
	if body != nil {
		rd = strings.NewReader(string(canonical(body)))
	} else {
		rd = strings.NewReader("")
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	answer := map[string]any{}
	_ = json.NewDecoder(resp.Body).Decode(&answer)
	return resp.StatusCode, answer, nil
}

// capability is idempotent, deterministic_id, query or none, as the tool declares it.
func capability(tool string) string {
	capabilitiesM.Lock()
	defer capabilitiesM.Unlock()
	if _, ok := capabilities[tool]; !ok {
		if _, health, err := call("GET", toolURL+"/health", nil); err == nil {
			if tools, ok := health["tools"].(map[string]any); ok {
				for k, v := range tools {
					capabilities[k] = str(v)
				}
			}
			if server, ok := health["server"].(map[string]any); ok && server["idempotency_retention_s"] != nil {
				seconds, _ := server["idempotency_retention_s"].(float64)
				idempotencyRetentionMS = int64(seconds * 1000)
			}
		}
	}
	if c, ok := capabilities[tool]; ok {
		return c
	}
	return "none"
}

// resendable: a same-key resend to this tool creates nothing new.
func resendable(tool string) bool {
	c := capability(tool)
	return c == "idempotent" || c == "deterministic_id"
}

// retentionMS is how long an idempotent tool remembers a key (nil: for ever, or no key).
func retentionMS(tool string) any {
	if capability(tool) != "idempotent" || idempotencyRetentionMS < 0 {
		return nil
	}
	return idempotencyRetentionMS
}

// send creates the operation at its tool: the ledger status and the remote id.
func send(op map[string]any, epoch int64) (string, string) {
	body := map[string]any{"operation_id": op["operation_id"], "run_id": op["run_id"], "epoch": epoch,
		"request": op["request"]}
	status, answer, err := call("POST", toolURL+"/tools/"+str(op["tool_name"])+"/operations", body)
	switch {
	case err != nil:
		return "unknown", "" // it may have acted
	case status == 200 || status == 201 || status == 409: // created, replayed, or exists
		return "succeeded", str(answer["resource_id"])
	case status == 422:
		return "failed_final", ""
	case status == 429:
		return "prepared", "" // the tool proved it did nothing
	}
	return "unknown", ""
}

// query is the remote resource of an operation, if the tool can say and has one.
func query(op map[string]any) string {
	if capability(str(op["tool_name"])) == "none" {
		return ""
	}
	u := toolURL + "/tools/" + str(op["tool_name"]) + "/operations/" + url.PathEscape(str(op["operation_id"]))
	status, answer, err := call("GET", u, nil)
	if err != nil || status != 200 {
		return ""
	}
	return str(answer["resource_id"])
}

// requestBody is the tool step's request (section 10).
func requestBody(input map[string]any) map[string]any {
	body := map[string]any{"kind": "return_label", "order_id": "order-1", "amount": 10,
		"plan_ok": true, "refundable": true}
	for _, k := range []string{"order_id", "amount"} {
		if v, ok := input[k]; ok {
			body[k] = v
		}
	}
	for _, k := range sensitive {
		if v, ok := input[k]; ok {
			body[k] = v
		}
	}
	return body
}

// ------------------------------------------------------------ checkpoint versions

// legacySample is a version-1 checkpoint this worker migrates, and what it
// must keep; with planDone one whose every step is done (experiment M[plan_done]).
func legacySample(planDone bool) map[string]any {
	steps := []any{"plan", "lookup"}
	if planDone {
		steps = []any{"plan", "lookup", "create_label", "notify"}
	}
	expect := map[string]any{"done": steps, "data.order_id": "o-legacy", "data.amount": 42}
	sample := map[string]any{"schema_version": 1,
		"state":  map[string]any{"steps": steps, "order": map[string]any{"id": "o-legacy", "amount": 42}},
		"expect": expect}
	if planDone {
		// The first write after resuming it is the finish, which adds itself
		// to "done": only the data must be kept there.
		delete(expect, "done")
		sample["plan_done"] = true
	}
	return sample
}

// decode gives a stored checkpoint in this worker's current version (section
// 6, experiment M): migrated from version 1, or refused (SchemaVersionUnknown,
// CheckpointCorrupt); a field a version needs is never defaulted.
func decode(ck map[string]any) (map[string]any, error) {
	version := num(ck["schema_version"])
	if version != 1 && version != schemaVersion {
		return nil, refuse("SchemaVersionUnknown", "checkpoint schema version %d", version)
	}
	state, ok := ck["state_json"].(map[string]any)
	if !ok {
		return nil, refuse("SchemaVersionUnknown", "checkpoint state is not an object")
	}
	if stored, _ := ck["state_hash"].([]byte); !bytes.Equal(stored, sha(state)) {
		return nil, refuse("CheckpointCorrupt", "checkpoint revision %v does not match its hash", ck["revision"])
	}
	if version == schemaVersion {
		return state, nil
	}
	order, ok := state["order"].(map[string]any)
	if !ok {
		return nil, refuse("SchemaVersionUnknown", "checkpoint lacks a valid \"order\" (object)")
	}
	steps, ok := state["steps"].([]any)
	if !ok {
		return nil, refuse("SchemaVersionUnknown", "checkpoint lacks a valid \"steps\" (list)")
	}
	return map[string]any{"done": append([]any{}, steps...),
		"data": map[string]any{"order_id": order["id"], "amount": order["amount"]}}, nil
}

// ------------------------------------------------------------ heartbeat

// Heartbeat renews one lease every interval; the first refused or
// unconfirmed renewal (none within the timeout) calls onLost once and stops.
type Heartbeat struct {
	stop chan struct{}
	once sync.Once
	lost atomic.Bool
}

func startHeartbeat(dsn string, l Lease, interval, timeout int64, onLost func()) *Heartbeat {
	h := &Heartbeat{stop: make(chan struct{})}
	db := &Db{dsn: dsn}
	go func() {
		for {
			select {
			case <-h.stop:
				return
			case <-time.After(time.Duration(interval) * time.Millisecond):
			}
			point("before_renew", l.RunID, l.Epoch, 0, "")
			ctx, cancel := context.WithTimeout(bg, time.Duration(timeout)*time.Millisecond)
			err := recorded("renew", Ids{"run_id": l.RunID, "epoch": l.Epoch}, func(Ids) error {
				_, err := db.rows(ctx, "SELECT fencecheck.renew($1::uuid, $2, $3, $4)", l.RunID, l.Owner, l.Epoch, leaseTTL)
				return toRefusal(err)
			})
			cancel()
			select {
			case <-h.stop:
				return
			default:
			}
			if err != nil {
				h.lost.Store(true)
				onLost()
				return
			}
		}
	}()
	return h
}

func (h *Heartbeat) Stop() { h.once.Do(func() { close(h.stop) }) }

// ------------------------------------------------------------ dispatch, relay, consume

// opColumns are a ledger row's columns as JSON-friendly types.
const opColumns = "operation_id, run_id::text, tool_name, request, status, remote_id, revision"

// claimOp is dispatch_claim (prepared) or ledger_claim_retry (unknown) for
// who, with the claim's deadline by this process's monotonic clock, read
// before the claim was sent (so it ends no later than the database's).
func claimOp(d *Db, function string, opID any, who string) (map[string]any, error) {
	sent := time.Now()
	op, err := d.one("SELECT "+opColumns+" FROM fencecheck."+function+"($1, $2, $3)", opID, who, dispatchTTL)
	if op != nil {
		op["local_deadline"] = sent.Add(time.Duration(dispatchTTL) * time.Millisecond)
	}
	return op, err
}

// sendClaimed calls the tool for an operation this session claimed, between
// the two injection points around the call: the ledger status and remote id.
// A claim past its deadline (this process was frozen after claiming: a
// successor may hold a newer claim) sends nothing and counts as unknown.
func sendClaimed(op map[string]any, epoch int64) (string, string) {
	runID, id := str(op["run_id"]), str(op["operation_id"])
	point("after_dispatch_claim_commit", runID, epoch, 0, id)
	if deadline, ok := op["local_deadline"].(time.Time); ok && !time.Now().Before(deadline) {
		return "unknown", ""
	}
	status, remote := send(op, epoch)
	point("after_tool_response_before_tx2_commit", runID, epoch, 0, id)
	return status, remote
}

// recordAnswer records the tool's answer in the ledger, only under this claim
// (same dispatch owner, same ledger revision); else it reports what the ledger says now.
func recordAnswer(d *Db, op map[string]any, who, status, remote string) (string, string, error) {
	ok, err := d.one("SELECT fencecheck.record_tool_result($1, $2, $3, $4, $5) AS ok",
		op["operation_id"], who, op["revision"], status, nullable(remote))
	if err != nil || ok["ok"] == true {
		return status, remote, err
	}
	now, err := d.one("SELECT status, remote_id FROM tool_operations WHERE operation_id = $1", op["operation_id"])
	if err != nil || now == nil {
		return status, remote, err
	}
	return str(now["status"]), str(now["remote_id"]), nil
}

// runEpoch: a dispatcher that holds no lease sends the run's current epoch.
func runEpoch(d *Db, runID any) (int64, error) {
	run, err := d.one("SELECT epoch FROM agent_runs WHERE run_id = $1::uuid", runID)
	return num(run["epoch"]), err
}

// dispatch is one dispatcher cycle: claim a prepared operation, call its tool, record the answer.
func dispatch(d *Db, opID string) (map[string]any, error) {
	op, err := claimOp(d, "dispatch_claim", nullable(opID), owner)
	if err != nil || op == nil {
		return map[string]any{"operation_id": nullable(opID), "status": nil}, err
	}
	epoch, err := runEpoch(d, op["run_id"])
	if err != nil {
		return nil, err
	}
	status, remote := sendClaimed(op, epoch)
	status, remote, err = recordAnswer(d, op, owner, status, remote)
	return map[string]any{"operation_id": op["operation_id"], "status": status, "remote_id": nullable(remote)}, err
}

// reconcile: expired dispatch claims become unknown; an unknown operation
// converges by a query of its tool, or by a same-key resend where that
// creates nothing new (idempotent within its retention, deterministic_id).
func reconcile(d *Db) ([]map[string]any, error) {
	changes := []map[string]any{}
	expired, err := d.rows(bg, "SELECT fencecheck.reconcile_expire_claims() AS op")
	if err != nil {
		return nil, err
	}
	for _, r := range expired {
		changes = append(changes, map[string]any{"operation_id": r["op"], "from": "dispatching", "to": "unknown"})
	}
	unknown, err := d.rows(bg, "SELECT "+opColumns+" FROM tool_operations WHERE status = 'unknown'")
	if err != nil {
		return nil, err
	}
	for _, op := range unknown {
		status := ""
		if remote := query(op); remote != "" {
			ok, err := d.one("SELECT fencecheck.ledger_converge($1, 'succeeded', $2) AS ok", op["operation_id"], remote)
			if err != nil {
				return nil, err
			}
			if ok["ok"] == true {
				status = "succeeded"
			}
		} else if resendable(str(op["tool_name"])) {
			claimed, err := claimOp(d, "ledger_claim_retry", op["operation_id"], owner)
			if err != nil {
				return nil, err
			}
			if claimed != nil {
				epoch, err := runEpoch(d, claimed["run_id"])
				if err != nil {
					return nil, err
				}
				sent, remote := sendClaimed(claimed, epoch)
				if sent == "prepared" { // a 429 to the resend: the call it repeats may still act
					sent = "unknown"
				}
				if status, _, err = recordAnswer(d, claimed, owner, sent, remote); err != nil {
					return nil, err
				}
			}
		}
		if status != "" && status != "unknown" {
			changes = append(changes, map[string]any{"operation_id": op["operation_id"], "from": "unknown", "to": status})
		}
	}
	return changes, nil
}

// relay publishes unpublished outbox rows (topic = event_type), marking
// each only after the broker acknowledged it.
func relay(d *Db, limit int64) ([]string, error) {
	published := []string{}
	conn, err := d.c()
	if err != nil {
		return nil, err
	}
	err = pgx.BeginFunc(bg, conn, func(tx pgx.Tx) error {
		r, err := tx.Query(bg, "SELECT event_id::text, run_id::text, tenant_id::text, event_type, payload FROM fencecheck.outbox_lock_batch($1)", limit)
		if err != nil {
			return err
		}
		rows, err := pgx.CollectRows(r, pgx.RowToMap)
		if err != nil {
			return err
		}
		for _, row := range rows {
			message := map[string]any{"event_id": row["event_id"], "run_id": row["run_id"]}
			if p, ok := row["payload"].(map[string]any); ok {
				for k, v := range p {
					message[k] = v
				}
			}
			// The row's tenant last: a consumer at a shared broker tells its
			// events by it, and some payloads (compensation) carry none.
			message["tenant_id"] = row["tenant_id"]
			status, answer, err := call("POST", brokerURL+"/broker/publish",
				map[string]any{"event_id": row["event_id"], "topic": row["event_type"], "payload": message})
			if err != nil || status != 200 || answer["ack"] != true {
				break
			}
			point("after_broker_ack_before_outbox_mark", str(row["run_id"]), 0, 0, "")
			if _, err := tx.Exec(bg, "SELECT fencecheck.outbox_mark_published($1::uuid)", row["event_id"]); err != nil {
				return err
			}
			published = append(published, str(row["event_id"]))
		}
		return nil
	})
	return published, err
}

var (
	consumedUpTo  = map[string]int64{}
	consumedUpToM sync.Mutex
)

// consume applies each new broker message of this tenant once: the dedup
// row and the business effect in one transaction.
func consume(d *Db, consumer string) (map[string]any, error) {
	consumedUpToM.Lock()
	defer consumedUpToM.Unlock()
	_, answer, err := call("GET", fmt.Sprintf("%s/broker/messages?after=%d", brokerURL, consumedUpTo[consumer]), nil)
	if err != nil {
		return nil, err
	}
	consumed, duplicates := 0, 0
	messages, _ := answer["messages"].([]any)
	conn, err := d.c()
	if err != nil {
		return nil, err
	}
	for _, m := range messages {
		msg, _ := m.(map[string]any)
		if seq := num(msg["seq"]); seq > consumedUpTo[consumer] {
			consumedUpTo[consumer] = seq
		}
		payload, _ := msg["payload"].(map[string]any)
		if payload == nil || payload["tenant_id"] != tenant {
			continue
		}
		err := pgx.BeginFunc(bg, conn, func(tx pgx.Tx) error {
			tag, err := tx.Exec(bg, "INSERT INTO consumed_events (consumer_name, event_id) VALUES ($1, $2::uuid)"+
				" ON CONFLICT DO NOTHING", consumer, msg["event_id"])
			if err != nil || tag.RowsAffected() == 0 {
				duplicates += boolInt(err == nil)
				return err
			}
			consumed++
			_, err = tx.Exec(bg, "INSERT INTO consumer_effects (consumer_name, event_id, effect) VALUES ($1, $2::uuid, $3)",
				consumer, msg["event_id"], "notified:"+str(msg["topic"]))
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	return map[string]any{"consumed": consumed, "duplicates": duplicates}, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// durability is the replication mode an acknowledged commit has here (never sync under async).
func durability(d *Db) (map[string]any, error) {
	s, err := d.one("SELECT current_setting('synchronous_commit') AS level," +
		" current_setting('synchronous_standby_names') AS names," +
		" (SELECT count(*) FROM pg_stat_replication) AS standbys")
	if err != nil {
		return nil, err
	}
	names, level := strings.TrimSpace(str(s["names"])), str(s["level"])
	mode, guarantee := "none", "durable on this primary only"
	if names != "" && (level == "on" || level == "remote_write" || level == "remote_apply") {
		mode, guarantee = "sync", "a COMMIT is acknowledged after a synchronous standby has it"
	} else if names != "" || num(s["standbys"]) > 0 {
		mode, guarantee = "async", "acknowledged commits may be lost if a standby is promoted"
	}
	return map[string]any{"mode": mode, "guarantee": guarantee, "settings": s}, nil
}

// ------------------------------------------------------------ `ops` mode (section 5)

// Args are one request's arguments.
type Args map[string]any

func (a Args) s(k string) string { return str(a[k]) }
func (a Args) n(k string) int64  { return num(a[k]) }
func (a Args) has(k string) bool { return a[k] != nil && a[k] != "" }
func (a Args) obj(k string) map[string]any {
	m, _ := a[k].(map[string]any)
	if m == nil {
		m = map[string]any{}
	}
	return m
}

// Ops serves one JSON request per line on stdin, one reply per line on stdout.
type Ops struct {
	dsn        string
	out        sync.Mutex
	heartbeats sync.Map // "run/epoch" -> *Heartbeat
}

type handler func(o *Ops, d *Db, a Args) (any, error)

var handlers = map[string]handler{
	"create_run": (*Ops).createRun, "retry_run": (*Ops).retryRun, "cancel": (*Ops).cancel,
	"deliver_callback": (*Ops).deliverCallback, "reconcile": (*Ops).reconcile,
	"list_paused": (*Ops).listPaused, "operator_actions": (*Ops).operatorActions,
	"claim": (*Ops).claim, "renew": (*Ops).renew, "release": (*Ops).release, "heartbeat": (*Ops).heartbeat,
	"save_checkpoint": (*Ops).saveCheckpoint, "register_intent": (*Ops).registerIntent,
	"complete": (*Ops).complete, "dispatch": (*Ops).dispatch, "relay": (*Ops).relay,
	"consume": (*Ops).consume, "read_checkpoint": (*Ops).readCheckpoint,
	"legacy_checkpoint": (*Ops).legacyCheckpoint, "durability": (*Ops).durability,
	"run_state": (*Ops).runState,
}

// boundToTenant says whether the login role is bound to FENCECHECK_TENANT;
// checked at start in every mode that acts (run and ops): a process told
// another tenant than its binding must not serve anything.
func boundToTenant(d *Db) bool {
	bound, err := d.one("SELECT fencecheck.session_tenant()::text AS tenant")
	if err != nil || bound == nil || bound["tenant"] != tenant {
		logf("the login role is not bound to FENCECHECK_TENANT", "tenant", tenant, "error", fmt.Sprint(err))
		return false
	}
	return true
}

func (o *Ops) serve() int {
	main := &Db{dsn: o.dsn}
	if !boundToTenant(main) {
		return 1
	}
	var wg sync.WaitGroup
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		var req struct {
			ID    any    `json:"id"`
			Op    string `json:"op"`
			Args  Args   `json:"args"`
			Async bool   `json:"async"`
		}
		dec := json.NewDecoder(strings.NewReader(line))
		dec.UseNumber()
		// A line that is no JSON object (a list, a number, null) is no request:
		// json.Decode would take null into an empty struct without an error.
		if !strings.HasPrefix(line, "{") {
			o.reply(map[string]any{"id": nil, "ok": false, "error": "BadRequest", "message": "a request is a JSON object"})
			continue
		}
		if err := dec.Decode(&req); err != nil {
			o.reply(map[string]any{"id": nil, "ok": false, "error": "BadRequest", "message": err.Error()})
			continue
		}
		if req.Async { // its own goroutine and connection; answers when done
			wg.Add(1)
			go func() { defer wg.Done(); o.reply(o.handle(&Db{dsn: o.dsn}, req.ID, req.Op, req.Args)) }()
		} else {
			o.reply(o.handle(main, req.ID, req.Op, req.Args))
		}
	}
	wg.Wait()
	return 0
}

func (o *Ops) reply(r map[string]any) {
	b, _ := json.Marshal(r)
	o.out.Lock()
	defer o.out.Unlock()
	os.Stdout.Write(append(b, '\n'))
}

func (o *Ops) handle(d *Db, id any, op string, a Args) map[string]any {
	h, ok := handlers[op]
	if !ok {
		return map[string]any{"id": id, "ok": false, "error": "Unsupported", "message": "no op " + op}
	}
	if a == nil {
		a = Args{}
	}
	result, err := h(o, d, a)
	if err != nil {
		class, _ := classify(err)
		return map[string]any{"id": id, "ok": false, "error": class, "message": err.Error()}
	}
	return map[string]any{"id": id, "ok": true, "result": result}
}

func (o *Ops) lease(a Args) Lease {
	who := a.s("owner")
	if who == "" {
		who = owner
	}
	return Lease{a.s("run_id"), who, a.n("epoch")}
}

// write is a protected write of an op, refused when this lease's heartbeat failed.
func (o *Ops) write(d *Db, op string, l Lease, a Args, w Write) (int64, error) {
	if h, ok := o.heartbeats.Load(fmt.Sprint(l.RunID, "/", l.Epoch)); ok && h.(*Heartbeat).lost.Load() {
		return 0, refuse("LeaseLost", "this lease's heartbeat failed: its work is cancelled")
	}
	if w.EventID == "" {
		w.EventID = newEventID()
	}
	if w.SchemaVersion == 0 {
		w.SchemaVersion = schemaVersion
	}
	var revision int64
	expected := a.n("expected_revision")
	err := recorded(op, Ids{"run_id": l.RunID, "epoch": l.Epoch, "revision": expected, "event_id": w.EventID},
		func(ids Ids) error {
			var err error
			revision, err = protectedWrite(d, l, expected, w)
			ids["revision"] = revision
			return err
		})
	return revision, err
}

func (o *Ops) currentState(d *Db, runID string) (map[string]any, error) {
	ck, err := latestCheckpoint(d, runID)
	if err != nil || ck == nil {
		return map[string]any{}, err
	}
	return decode(ck)
}

// -- control plane

func (o *Ops) createRun(d *Db, a Args) (any, error) {
	if a.has("tenant_id") && a.s("tenant_id") != tenant {
		return nil, refuse("BadRequest", "this session is bound to tenant %s", tenant)
	}
	max := a.n("max_attempts")
	if max == 0 {
		max = 12
	}
	var row map[string]any
	err := recorded("create_run", Ids{}, func(Ids) (err error) {
		row, err = d.one("SELECT fencecheck.create_run($1, $2, $3::int)::text AS run_id", a.s("task_id"), a.obj("input"), max)
		return toRefusal(err)
	})
	return map[string]any{"run_id": row["run_id"], "task_id": a.s("task_id")}, err
}

func (o *Ops) retryRun(d *Db, a Args) (any, error) {
	var row map[string]any
	err := recorded("retry_run", Ids{}, func(Ids) (err error) {
		row, err = d.one("SELECT fencecheck.retry_run($1)::text AS run_id", a.s("task_id"))
		return toRefusal(err)
	})
	return map[string]any{"run_id": row["run_id"], "task_id": a.s("task_id")}, err
}

func (o *Ops) cancel(d *Db, a Args) (any, error) {
	var row map[string]any
	reason := a.s("reason")
	if reason == "" {
		reason = "cancelled"
	}
	err := recorded("cancel", Ids{"run_id": a.s("run_id")}, func(Ids) (err error) {
		row, err = d.one("SELECT fencecheck.cancel_run($1::uuid, $2, $3) AS r", a.s("run_id"), reason, nullable(a.s("ticket")))
		return toRefusal(err)
	})
	return row["r"], err
}

func (o *Ops) deliverCallback(d *Db, a Args) (any, error) {
	var row map[string]any
	err := recorded("deliver_callback", Ids{"run_id": a.s("run_id"), "operation_id": a.s("operation_id")}, func(Ids) (err error) {
		row, err = d.one("SELECT fencecheck.deliver_callback($1::uuid, $2, $3) AS accepted",
			a.s("run_id"), a.s("operation_id"), a.obj("payload"))
		return err
	})
	return map[string]any{"accepted": row["accepted"] == true}, err
}

func (o *Ops) reconcile(d *Db, a Args) (any, error) {
	var changes []map[string]any
	err := recorded("reconcile", Ids{}, func(Ids) (err error) { changes, err = reconcile(d); return err })
	return map[string]any{"changes": changes}, err
}

func (o *Ops) listPaused(d *Db, a Args) (any, error) {
	rows, err := d.rows(bg, "SELECT run_id::text, status FROM agent_runs"+
		" WHERE status IN ('paused_indoubt', 'paused_human') ORDER BY updated_at")
	return map[string]any{"runs": rows}, err
}

func (o *Ops) operatorActions(d *Db, a Args) (any, error) {
	rows, err := d.rows(bg, "SELECT action, operator::text, reason, ticket FROM operator_actions"+
		" WHERE run_id = $1::uuid ORDER BY id", a.s("run_id"))
	return map[string]any{"actions": rows}, err
}

// -- the lease

func (o *Ops) claim(d *Db, a Args) (any, error) {
	who := a.s("owner")
	if who == "" {
		who = owner
	}
	var grant map[string]any
	err := recorded("claim", Ids{"run_id": a.s("run_id")}, func(ids Ids) (err error) {
		if grant, err = claim(d, who, a.s("run_id")); err == nil && grant == nil {
			return refuse("NotClaimable", "nothing claimable")
		}
		if grant != nil {
			ids["run_id"], ids["epoch"], ids["revision"] = grant["run_id"], grant["epoch"], grant["revision"]
		}
		return err
	})
	delete(grant, "input")
	return grant, err
}

func (o *Ops) renew(d *Db, a Args) (any, error) {
	l := o.lease(a)
	var row map[string]any
	err := recorded("renew", Ids{"run_id": l.RunID, "epoch": l.Epoch}, func(Ids) (err error) {
		row, err = d.one("SELECT fencecheck.renew($1::uuid, $2, $3, $4)::text AS expires_at", l.RunID, l.Owner, l.Epoch, leaseTTL)
		return toRefusal(err)
	})
	return map[string]any{"expires_at": row["expires_at"]}, err
}

func (o *Ops) release(d *Db, a Args) (any, error) {
	l := o.lease(a)
	err := recorded("release", Ids{"run_id": l.RunID, "epoch": l.Epoch}, func(Ids) error {
		_, err := d.rows(bg, "SELECT fencecheck.release($1::uuid, $2, $3)", l.RunID, l.Owner, l.Epoch)
		return toRefusal(err)
	})
	return map[string]any{}, err
}

func (o *Ops) heartbeat(d *Db, a Args) (any, error) {
	l := o.lease(a)
	key := fmt.Sprint(l.RunID, "/", l.Epoch)
	old, had := o.heartbeats.LoadAndDelete(key)
	if had {
		old.(*Heartbeat).Stop()
	}
	if a.s("action") == "stop" {
		return map[string]any{"cancelled": had && old.(*Heartbeat).lost.Load()}, nil
	}
	interval, timeout := a.n("interval_ms"), a.n("timeout_ms")
	if interval == 0 {
		interval = heartbeatMS
	}
	if timeout == 0 {
		timeout = heartbeatTO
	}
	o.heartbeats.Store(key, startHeartbeat(o.dsn, l, interval, timeout, func() { logf("lease lost", "run_id", l.RunID) }))
	return map[string]any{}, nil
}

// -- protected writes

func (o *Ops) saveCheckpoint(d *Db, a Args) (any, error) {
	l := o.lease(a)
	w := Write{State: a.obj("state"), Step: a.s("step"), Event: "agent.checkpoint", EventID: a.s("event_id"),
		SchemaVersion: a.n("schema_version")}
	if w.EventID == "" {
		w.EventID = newEventID()
	}
	revision, err := o.write(d, "save_checkpoint", l, a, w)
	return map[string]any{"revision": revision, "event_id": w.EventID}, err
}

func (o *Ops) registerIntent(d *Db, a Args) (any, error) {
	l := o.lease(a)
	step, version := a.s("step_id"), a.n("effect_version")
	opID := fmt.Sprintf("%s/%s/%s/v%d", tenant, l.RunID, step, version)
	request := a.obj("request")
	state, err := o.currentState(d, l.RunID)
	if err != nil {
		return nil, err
	}
	state["pending"] = opID
	intent := map[string]any{"operation_id": opID, "step_id": step, "effect_version": version,
		"tool": a.s("tool"), "request": request, "digest": hex.EncodeToString(sha(request))}
	revision, err := o.write(d, "register_intent", l, a,
		Write{State: state, Step: step, Status: "waiting_tool", Event: "agent.tool_intent", Intent: intent})
	if err != nil {
		return nil, err
	}
	point("after_outbound_intent_commit", l.RunID, l.Epoch, revision, opID)
	return map[string]any{"operation_id": opID, "revision": revision, "ledger_status": "prepared"}, nil
}

func (o *Ops) complete(d *Db, a Args) (any, error) {
	l := o.lease(a)
	state, err := o.currentState(d, l.RunID)
	if err != nil {
		return nil, err
	}
	state["result"] = a["result"]
	revision, err := o.write(d, "complete", l, a,
		Write{State: state, Step: "finish", Status: "succeeded", Event: "agent.succeeded"})
	return map[string]any{"revision": revision, "status": "succeeded"}, err
}

// -- the ledger, the outbox, the consumer

func (o *Ops) dispatch(d *Db, a Args) (any, error) {
	var out map[string]any
	err := recorded("dispatch", Ids{"operation_id": a.s("operation_id")}, func(Ids) (err error) {
		out, err = dispatch(d, a.s("operation_id"))
		return err
	})
	return out, err
}

func (o *Ops) relay(d *Db, a Args) (any, error) {
	limit := a.n("limit")
	if limit == 0 {
		limit = 20
	}
	var published []string
	err := recorded("relay", Ids{}, func(Ids) (err error) { published, err = relay(d, limit); return err })
	return map[string]any{"published": published}, err
}

func (o *Ops) consume(d *Db, a Args) (any, error) {
	var out map[string]any
	err := recorded("consume", Ids{}, func(Ids) (err error) { out, err = consume(d, a.s("consumer")); return err })
	return out, err
}

// -- reads

func (o *Ops) readCheckpoint(d *Db, a Args) (any, error) {
	out := map[string]any{"revision": 0, "schema_version": nil, "state": nil}
	err := recorded("read_checkpoint", Ids{"run_id": a.s("run_id")}, func(Ids) error {
		ck, err := latestCheckpoint(d, a.s("run_id"))
		if err != nil {
			return err
		}
		if ck == nil {
			run, err := d.one("SELECT 1 AS found FROM agent_runs WHERE run_id = $1::uuid", a.s("run_id"))
			if err == nil && run == nil {
				return refuse("RunNotFound", "no run %s of this tenant", a.s("run_id"))
			}
			return err
		}
		state, err := decode(ck)
		out = map[string]any{"revision": ck["revision"], "schema_version": schemaVersion, "state": state}
		return err
	})
	return out, err
}

func (o *Ops) legacyCheckpoint(d *Db, a Args) (any, error) {
	return legacySample(a["plan_done"] == true), nil
}

func (o *Ops) durability(d *Db, a Args) (any, error) { return durability(d) }

func (o *Ops) runState(d *Db, a Args) (any, error) {
	row, err := d.one("SELECT to_jsonb(r) AS run FROM agent_runs r WHERE run_id = $1::uuid", a.s("run_id"))
	if err != nil || row == nil {
		return map[string]any{}, err
	}
	return row["run"], nil
}

// ------------------------------------------------------------ `run` mode (section 10)

const (
	exitCancelled  = 10
	exitFrozen     = 11
	exitSchema     = 12
	exitDurability = 13
)

// Execution is one run under one lease, resumed from its latest checkpoint.
type Execution struct {
	db       *Db
	lease    Lease
	revision int64
	input    map[string]any
	state    map[string]any
	givingUp atomic.Bool // a write that gives the lease up is under way
}

func (e *Execution) run() int {
	hb := startHeartbeat(e.db.dsn, e.lease, heartbeatMS, heartbeatTO, func() {
		if e.givingUp.Load() { // the write giving the lease up decides (LeaseLost: exit 10)
			return
		}
		logf("lease lost or renewal unconfirmed: cancelling", "run_id", e.lease.RunID)
		os.Exit(exitCancelled) // cancel the execution at once: nothing more is sent
	})
	defer hb.Stop()
	code, err := e.steps()
	if err != nil {
		class, _ := classify(err)
		logf("run stopped", "run_id", e.lease.RunID, "error", err.Error())
		switch class {
		case "SchemaVersionUnknown", "CheckpointCorrupt":
			return exitSchema
		case "LeaseLost", "RevisionConflict":
			return exitCancelled
		}
		return 1
	}
	return code
}

func (e *Execution) write(op, step, status string, w Write) error {
	w.State, w.Step, w.Status, w.Event = e.state, step, status, "agent."+op
	w.EventID, w.SchemaVersion = newEventID(), schemaVersion
	e.givingUp.Store(status != "running" && status != "waiting_tool")
	err := recorded(op, Ids{"run_id": e.lease.RunID, "epoch": e.lease.Epoch, "revision": e.revision, "event_id": w.EventID},
		func(ids Ids) error {
			revision, err := protectedWrite(e.db, e.lease, e.revision, w)
			if err == nil {
				e.revision, ids["revision"] = revision, revision
			}
			return err
		})
	if err == nil {
		point("after_checkpoint_commit", e.lease.RunID, e.lease.Epoch, e.revision, "")
	}
	return err
}

func (e *Execution) done() []any { d, _ := e.state["done"].([]any); return d }

func (e *Execution) isDone(step string) bool {
	for _, s := range e.done() {
		if s == step {
			return true
		}
	}
	return false
}

// with returns a copy of the state with key set (states are never changed in place).
func (e *Execution) with(key string, value any) map[string]any {
	next := map[string]any{}
	for k, v := range e.state {
		next[k] = v
	}
	next[key] = value
	return next
}

// step does one step's work (here: wait step_delay_ms), then commits it.
func (e *Execution) step(name string) error {
	time.Sleep(time.Duration(num(e.input["step_delay_ms"])) * time.Millisecond)
	e.state = e.with("done", append(append([]any{}, e.done()...), name))
	return e.write(name, name, "running", Write{})
}

func (e *Execution) steps() (int, error) {
	ck, err := latestCheckpoint(e.db, e.lease.RunID)
	if err != nil {
		return 0, err
	}
	if ck == nil {
		body := requestBody(e.input)
		e.state = map[string]any{"done": []any{}, "data": map[string]any{"order_id": body["order_id"], "amount": body["amount"]}}
		if err := e.write("start", "plan", "running", Write{}); err != nil {
			return 0, err
		}
	} else {
		if e.state, err = decode(ck); err != nil {
			return 0, err
		}
	}
	for _, name := range []string{"plan", "lookup"} {
		if !e.isDone(name) {
			if err := e.step(name); err != nil {
				return 0, err
			}
		}
	}
	if !e.isDone("create_label") {
		if code, stop, err := e.toolStep(); stop || err != nil {
			return code, err
		}
	}
	names := []string{"notify"}
	for i := int64(1); i <= num(e.input["extra_steps"]); i++ {
		names = append(names, fmt.Sprintf("work_%d", i))
	}
	for _, name := range names {
		if !e.isDone(name) {
			if err := e.step(name); err != nil {
				return 0, err
			}
		}
	}
	e.state = e.with("done", append(append([]any{}, e.done()...), "finish"))
	return 0, e.write("complete", "finish", "succeeded", Write{})
}

// toolStep registers, dispatches and records the tool step; stop is true
// (with the exit code) when the run stops here: paused, requeued, frozen.
func (e *Execution) toolStep() (code int, stop bool, err error) {
	opID := fmt.Sprintf("%s/%s/create_label/v1", tenant, e.lease.RunID)
	ledger := func() (map[string]any, error) {
		return e.db.one("SELECT "+opColumns+", coalesce(dispatch_until > clock_timestamp(), false) AS claim_live"+
			" FROM tool_operations WHERE operation_id = $1", opID)
	}
	op, err := ledger()
	if err != nil {
		return 0, true, err
	}
	if op == nil {
		request := requestBody(e.input)
		tool := str(e.input["tool"])
		if tool == "" {
			tool = "idem"
		}
		intent := map[string]any{"operation_id": opID, "step_id": "create_label", "effect_version": 1,
			"tool": tool, "request": request, "digest": hex.EncodeToString(sha(request)), "retention_ms": retentionMS(tool)}
		e.state = e.with("pending", opID)
		if err := e.write("register_intent", "create_label", "waiting_tool", Write{Intent: intent}); err != nil {
			return 0, true, err
		}
		point("after_outbound_intent_commit", e.lease.RunID, e.lease.Epoch, e.revision, opID)
	}
	resends := 0
	for {
		if op, err = ledger(); err != nil {
			return 0, true, err
		}
		status, remote := str(op["status"]), str(op["remote_id"])
		if status == "dispatching" {
			if op["claim_live"] == true { // someone's claim: wait it out
				time.Sleep(50 * time.Millisecond)
			} else if _, err := e.db.rows(bg, "SELECT fencecheck.reconcile_expire_claims()"); err != nil {
				return 0, true, err
			}
			continue
		}
		if status == "cancelled" {
			return 0, true, refuse("LeaseLost", "the run was cancelled")
		}
		if status == "unknown" {
			remote = query(op)
		}
		if status == "unknown" && remote != "" {
			status = "succeeded"
		} else if status == "prepared" || status == "unknown" {
			var claimed map[string]any
			if status == "prepared" {
				claimed, err = e.claimForDispatch("dispatch_claim", opID)
			} else if resendable(str(op["tool_name"])) && resends < 3 {
				resends++
				claimed, err = e.claimForDispatch("ledger_claim_retry", opID)
			}
			if err != nil {
				return 0, true, err
			}
			if claimed == nil && status == "unknown" { // the remote fact is out of reach
				return exitFrozen, true, e.write("freeze", "create_label", "paused_indoubt", Write{})
			}
			if claimed == nil {
				continue
			}
			wasInDoubt := status == "unknown"
			status, remote = sendClaimed(claimed, e.lease.Epoch)
			if status == "prepared" && wasInDoubt { // a 429 to a same-key resend proves nothing
				status = "unknown" // of the call it repeats, which may still act: never prepared
			}
			if status == "unknown" || status == "prepared" { // only a final answer waits for tx2
				if _, _, err := recordAnswer(e.db, claimed, e.lease.Owner, status, ""); err != nil {
					return 0, true, err
				}
			}
			if status == "prepared" {
				return 0, true, e.requeue()
			}
			if status == "unknown" {
				continue
			}
		}
		result := map[string]any{"operation_id": opID, "status": status, "remote_id": nullable(remote)}
		if status == "failed_final" { // a definite refusal: a person decides
			return 0, true, e.write("pause_human", "create_label", "paused_human", Write{Result: result})
		}
		e.state = e.with("done", append(append([]any{}, e.done()...), "create_label"))
		e.state["pending"] = nil
		return 0, false, e.write("tool_result", "create_label", "running", Write{Result: result})
	}
}

// claimForDispatch is dispatch_claim (prepared) or ledger_claim_retry (unknown) under this lease's owner.
func (e *Execution) claimForDispatch(function, opID string) (map[string]any, error) {
	return claimOp(e.db, function, opID, e.lease.Owner)
}

// backoffBaseMS is the first full delay of a requeue (then doubled, capped at 10 s).
const backoffBaseMS = 400

// requeue: the tool said 429. Try again later with a growing, jittered
// delay, until the attempt budget is spent (then a person decides).
func (e *Execution) requeue() error {
	run, err := e.db.one("SELECT attempt_count, max_attempts FROM agent_runs WHERE run_id = $1::uuid", e.lease.RunID)
	if err != nil {
		return err
	}
	attempt := num(run["attempt_count"])
	if attempt >= num(run["max_attempts"]) {
		return e.write("pause_human", "create_label", "paused_human", Write{})
	}
	full := int64(backoffBaseMS) << (attempt - 1)
	if attempt > 7 || full > 10000 {
		full = 10000
	}
	delay := full/2 + rand.Int63n(full/2+1)
	return e.write("requeue", "create_label", "queued", Write{DelayMS: &delay})
}

func runMode(argv []string) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	runID := fs.String("run-id", "", "this run only")
	once := fs.Bool("once", false, "exit after one run")
	idle := fs.Bool("exit-when-idle", false, "exit 0 when nothing is claimable")
	require := fs.String("require-durability", os.Getenv("FENCECHECK_REQUIRE_DURABILITY"), "none|async|sync")
	if err := fs.Parse(argv); err != nil {
		return 64
	}
	d := &Db{dsn: os.Getenv("FENCECHECK_DSN")}
	if !boundToTenant(d) {
		return 1
	}
	contract, err := durability(d)
	if err != nil {
		return 1
	}
	logf("durability contract", "mode", contract["mode"], "guarantee", contract["guarantee"])
	order := map[string]int{"": 0, "none": 0, "async": 1, "sync": 2}
	if order[str(contract["mode"])] < order[*require] {
		return exitDurability
	}
	for {
		var grant map[string]any
		err := recorded("claim", Ids{"run_id": *runID}, func(ids Ids) (err error) {
			grant, err = claim(d, owner, *runID)
			if grant != nil {
				ids["run_id"], ids["epoch"] = grant["run_id"], grant["epoch"]
			}
			return err
		})
		if err != nil {
			logf("claim failed", "error", err.Error())
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if grant == nil {
			if *runID != "" { // that run only: wait until it is claimable, or done
				row, err := d.one("SELECT status FROM agent_runs WHERE run_id = $1::uuid", *runID)
				if err == nil && (row == nil || !strings.Contains("queued running waiting_tool", str(row["status"]))) {
					return 0
				}
			} else if *idle || *once {
				return 0
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		point("after_lease_acquired", str(grant["run_id"]), num(grant["epoch"]), num(grant["revision"]), "")
		input, _ := grant["input"].(map[string]any)
		e := &Execution{db: d, lease: Lease{str(grant["run_id"]), str(grant["owner"]), num(grant["epoch"])},
			revision: num(grant["revision"]), input: input}
		if code := e.run(); *once || *runID != "" || code != 0 {
			return code
		}
	}
}

// ------------------------------------------------------------ the command line (section 1)

// migrate applies schema.sql (the contract's tables, roles, tenant binding)
// and protocol.sql (this worker's functions); both are idempotent.
func migrate() int {
	conn, err := pgx.Connect(bg, os.Getenv("FENCECHECK_ADMIN_DSN"))
	if err != nil {
		logf("migrate: cannot connect", "error", err.Error())
		return 1
	}
	defer conn.Close(bg)
	for _, name := range []string{"schema.sql", "protocol.sql"} {
		sql, _ := migrations.ReadFile(name)
		logf("applying", "file", name)
		if _, err := conn.Exec(bg, string(sql)); err != nil { // no arguments: simple protocol, many statements
			logf("migrate failed", "file", name, "error", err.Error())
			return 1
		}
	}
	return 0
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: worker migrate | run [--run-id ID] [--once] | ops")
		os.Exit(64)
	}
	if os.Args[1] != "migrate" {
		if wrong := settingsRefused(); len(wrong) > 0 {
			logf("settings refused", "errors", wrong)
			os.Exit(1)
		}
	}
	switch os.Args[1] {
	case "migrate":
		os.Exit(migrate())
	case "ops":
		os.Exit((&Ops{dsn: os.Getenv("FENCECHECK_DSN")}).serve())
	case "run":
		os.Exit(runMode(os.Args[2:]))
	}
	fmt.Fprintf(os.Stderr, "unknown mode %q\n", os.Args[1])
	os.Exit(64)
}
