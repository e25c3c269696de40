// Shared bits of the SDK checks (sdk_openai.mjs, sdk_anthropic.mjs): options from argv/env,
// PASS/FAIL lines, and the exit code. Options (argv wins over env):
//   --base-url URL        TANDEM_BASE_URL   the gateway root, e.g. http://127.0.0.1:8000
//   --model NAME          TANDEM_MODEL      the served model name
//   --api-key KEY         TANDEM_API_KEY    sent as the SDK's API key (default "sk-none")
//   --expect-auth-error   the key is wrong: every call must fail with AuthenticationError
export function options(argv = process.argv.slice(2)) {
  const opts = {
    baseUrl: process.env.TANDEM_BASE_URL ?? '',
    model: process.env.TANDEM_MODEL ?? '',
    apiKey: process.env.TANDEM_API_KEY ?? 'sk-none',
    expectAuthError: false,
  };
  for (let i = 0; i < argv.length; ++i) {
    const arg = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) usage(`${arg} needs a value`);
      return argv[++i];
    };
    if (arg === '--base-url') opts.baseUrl = value();
    else if (arg === '--model') opts.model = value();
    else if (arg === '--api-key') opts.apiKey = value();
    else if (arg === '--expect-auth-error') opts.expectAuthError = true;
    else usage(`unknown argument '${arg}'`);
  }
  if (!opts.baseUrl) usage('no base URL (--base-url or TANDEM_BASE_URL)');
  if (!opts.model) usage('no model (--model or TANDEM_MODEL)');
  opts.baseUrl = opts.baseUrl.replace(/\/+$/, '');
  return opts;
}

function usage(problem) {
  console.error(`error: ${problem}`);
  console.error('usage: node <script> --base-url URL --model NAME [--api-key KEY] ' +
                '[--expect-auth-error]');
  process.exit(2);
}

const failures = [];
let passes = 0;

// Runs one named check: `body` throws (or returns a string) to fail; PASS/FAIL is printed.
export async function check(name, body) {
  try {
    const problem = await body();
    if (typeof problem === 'string' && problem) throw new Error(problem);
    passes += 1;
    console.log(`PASS ${name}`);
  } catch (err) {
    failures.push(name);
    const detail = err?.status ? `status ${err.status}: ${err.message}` : String(err?.stack ?? err);
    console.log(`FAIL ${name}: ${detail}`);
  }
}

export function expect(cond, what) {
  if (!cond) throw new Error(what);
}

export function expectEqual(actual, expected, what) {
  if (actual !== expected) {
    throw new Error(`${what}: got ${JSON.stringify(actual)}, expected ${JSON.stringify(expected)}`);
  }
}

// Checks that `call` fails with the SDK's AuthenticationError (HTTP 401).
export async function expectAuthError(call, errorClass) {
  try {
    await call();
  } catch (err) {
    expect(err instanceof errorClass,
           `expected AuthenticationError, got ${err?.constructor?.name}: ${err?.message}`);
    expectEqual(err.status, 401, 'status');
    return;
  }
  throw new Error('the call succeeded with a wrong API key');
}

export function finish(script) {
  console.log(`${script}: ${passes} passed, ${failures.length} failed`);
  process.exit(failures.length === 0 ? 0 : 1);
}
