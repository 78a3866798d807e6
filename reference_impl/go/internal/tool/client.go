// Package tool is the worker's client of the external tool and broker (the
// mock tool's HTTP API, docs/mock-tool.md). Every answer is classified by
// whether the tool may have acted: a timeout, a lost answer or a 5xx is
// "unknown", never a failure (rule 5).
package tool

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Answer is what the tool said to one create.
type Answer struct {
	Kind     string // succeeded | failed_final | unknown | rejected_retryable | conflict
	RemoteID *string
	Result   map[string]any
	Error    map[string]any
}

// Found is the remote fact learned by query.
type Found struct {
	ResourceID  string
	ResourceIDs []string
	BodyDigest  string
}

// ErrQueryUnsupported: the tool offers no query (HTTP 501).
var ErrQueryUnsupported = errors.New("query not supported by this tool")

// Client talks to one tool server (and its broker).
type Client struct {
	base, broker string
	http         *http.Client
	mu           sync.Mutex
	caps         map[string]string
	retentionS   *float64 // the server's declared key retention (server.idempotency_retention_s)
}

// DefaultTools are the mock tool's defaults, used when /health cannot be read.
var DefaultTools = map[string]string{"idem": "idempotent", "detid": "deterministic_id", "queryable": "query", "plain": "none"}

// New client; timeout bounds every call.
func New(base, broker string, timeout time.Duration) *Client {
	if broker == "" {
		broker = base
	}
	return &Client{base: strings.TrimRight(base, "/"), broker: strings.TrimRight(broker, "/"),
		http: &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}}
}

// Capability is what tool promises: the server's own answer, else the defaults.
func (c *Client) Capability(name string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.caps == nil && c.base != "" {
		var health struct {
			Tools  map[string]string `json:"tools"`
			Server struct {
				RetentionS *float64 `json:"idempotency_retention_s"`
			} `json:"server"`
		}
		if _, err := c.getJSON(c.base+"/health", &health); err == nil && health.Tools != nil {
			c.caps, c.retentionS = health.Tools, health.Server.RetentionS
		}
	}
	caps := c.caps
	if caps == nil {
		caps = DefaultTools
	}
	cap, ok := caps[name]
	if !ok {
		return "", fmt.Errorf("tool %q is unknown (known: %v)", name, caps)
	}
	return cap, nil
}

// RetentionMS is how long tool keeps an idempotency key, as the server
// declares it: idempotent tools only; nil when it declares none.
func (c *Client) RetentionMS(name string) (*int64, error) {
	capability, err := c.Capability(name)
	if err != nil || capability != "idempotent" {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.retentionS == nil {
		return nil, nil
	}
	// Rounded, not truncated: 1.005 s is 1004.999... ms in binary floating point.
	ms := int64(math.Round(*c.retentionS * 1000))
	return &ms, nil
}

func (c *Client) getJSON(u string, out any) (int, error) {
	resp, err := c.http.Get(u)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if out == nil {
		return resp.StatusCode, nil
	}
	if resp.StatusCode/100 == 2 {
		return resp.StatusCode, json.Unmarshal(body, out)
	}
	_ = json.Unmarshal(body, out) // an error's body, when it has one (404 in_progress)
	return resp.StatusCode, nil
}

func errInfo(class string, status int) map[string]any {
	var s any
	if status != 0 {
		s = status
	}
	return map[string]any{"class": class, "http_status": s}
}

// Create asks the tool to act, with operation_id as the idempotency key.
func (c *Client) Create(name, opID, runID string, epoch int64, request any) Answer {
	body, _ := json.Marshal(map[string]any{"operation_id": opID, "run_id": runID, "epoch": epoch, "request": request})
	resp, err := c.http.Post(c.base+"/tools/"+url.PathEscape(name)+"/operations", "application/json", bytes.NewReader(body))
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			// The request was never sent: the tool certainly did not act.
			return Answer{Kind: "rejected_retryable", Error: errInfo("ToolUnavailable", 0)}
		}
		return Answer{Kind: "unknown", Error: errInfo("ToolOutcomeUnknown", 0)}
	}
	defer resp.Body.Close()
	raw, rerr := io.ReadAll(resp.Body)
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	switch {
	case resp.StatusCode/100 == 2:
		rid, ok := out["resource_id"].(string)
		if rerr != nil || !ok {
			return Answer{Kind: "unknown", Error: errInfo("ToolOutcomeUnknown", resp.StatusCode)}
		}
		return Answer{Kind: "succeeded", RemoteID: &rid, Result: map[string]any{"resource_id": rid, "replayed": out["replayed"]}}
	case resp.StatusCode == http.StatusConflict:
		rid, ok := out["resource_id"].(string)
		if same, _ := out["same_request"].(bool); same && ok {
			return Answer{Kind: "succeeded", RemoteID: &rid, Result: map[string]any{"resource_id": rid, "conflict": true}}
		}
		return Answer{Kind: "conflict", Error: map[string]any{"class": "ToolConflict", "http_status": 409, "body": out}}
	case resp.StatusCode == http.StatusTooManyRequests:
		return Answer{Kind: "rejected_retryable", Error: errInfo("ToolRejected", 429)}
	case resp.StatusCode/100 == 4:
		e := errInfo("ToolRejected", resp.StatusCode)
		return Answer{Kind: "failed_final", Error: e, Result: map[string]any{"error": e}}
	}
	return Answer{Kind: "unknown", Error: errInfo("ToolOutcomeUnknown", resp.StatusCode)}
}

// Query asks the tool for the remote fact of opID: nil when it has none.
func (c *Client) Query(name, opID string) (*Found, error) {
	var out struct {
		ResourceID  string   `json:"resource_id"`
		ResourceIDs []string `json:"resource_ids"`
		BodyDigest  string   `json:"body_digest"`
		InProgress  bool     `json:"in_progress"`
	}
	status, err := c.getJSON(c.base+"/tools/"+url.PathEscape(name)+"/operations/"+url.PathEscape(opID), &out)
	switch {
	case err != nil:
		return nil, err
	case status == http.StatusNotFound && out.InProgress:
		// a create of it arrived and was not acted on yet: not found is no proof
		return nil, fmt.Errorf("query %s: not found, but a create is in progress", opID)
	case status == http.StatusNotFound:
		return nil, nil
	case status == http.StatusNotImplemented:
		return nil, ErrQueryUnsupported
	case status != http.StatusOK:
		return nil, fmt.Errorf("query %s: HTTP %d", opID, status)
	}
	return &Found{out.ResourceID, out.ResourceIDs, out.BodyDigest}, nil
}

// Publish sends one message to the broker; nil only on its acknowledgement.
func (c *Client) Publish(eventID, topic string, payload any) error {
	body, _ := json.Marshal(map[string]any{"event_id": eventID, "topic": topic, "payload": payload})
	resp, err := c.http.Post(c.broker+"/broker/publish", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var out struct {
		Ack bool `json:"ack"`
	}
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &out) != nil || !out.Ack {
		return fmt.Errorf("broker did not acknowledge %s: HTTP %d", eventID, resp.StatusCode)
	}
	return nil
}

// Message is one broker message.
type Message struct {
	Seq     int64          `json:"seq"`
	EventID string         `json:"event_id"`
	Topic   string         `json:"topic"`
	Payload map[string]any `json:"payload"`
}

// Messages after seq, in order.
func (c *Client) Messages(after int64) ([]Message, error) {
	var out struct {
		Messages []Message `json:"messages"`
	}
	status, err := c.getJSON(fmt.Sprintf("%s/broker/messages?after=%d", c.broker, after), &out)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("broker messages: HTTP %d", status)
	}
	return out.Messages, nil
}
