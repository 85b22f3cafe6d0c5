// Publish one verification-code job to mailgate and print its result.
//
//   npm ci && node producer.mjs user@example.com [client-ip]
//
// AMQP_URL and JOBS_QUEUE choose the broker and the queue (the defaults are
// mailgate's). The job and its result follow docs/schema/job.json and
// docs/schema/result.json.
import { randomInt, randomUUID } from "node:crypto";
import amqp from "amqplib";

const url = process.env.AMQP_URL ?? "amqp://guest:guest@127.0.0.1:5672/%2f";
const jobsQueue = process.env.JOBS_QUEUE ?? "mailgate.jobs";
const [email, ip] = process.argv.slice(2);
if (!email) {
  console.error("usage: node producer.mjs EMAIL [IP]");
  process.exit(2);
}

const conn = await amqp.connect(url);
try {
  const ch = await conn.createConfirmChannel(); // the broker confirms it has the job
  // A private queue for our result; a web backend keeps one per process
  // and matches results to requests by correlation_id.
  const { queue: replyTo } = await ch.assertQueue("", { exclusive: true });
  const job = {
    id: randomUUID(), // one id per send request; reused only to retry this request
    email,
    ...(ip ? { ip } : {}),
    // The application makes the code, keeps it (hashed) and checks it.
    code: String(randomInt(0, 1_000_000)).padStart(6, "0"),
    purpose: "verify",
    vars: { app_name: "Acme" },
    expires_at: new Date(Date.now() + 10 * 60_000).toISOString(),
  };
  const result = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("no result within 30s")), 30_000);
    timer.unref(); // the open connection keeps the process waiting, not the timer
    ch.consume(
      replyTo,
      (msg) => {
        if (msg?.properties.correlationId !== job.id) return;
        clearTimeout(timer);
        resolve(JSON.parse(msg.content.toString("utf8")));
      },
      { noAck: true },
    );
  });
  // mandatory: with no jobs queue (no worker ever started) RabbitMQ returns
  // the job instead of dropping it, and the confirm still comes.
  let returned = false;
  ch.on("return", () => {
    returned = true;
  });
  ch.sendToQueue(jobsQueue, Buffer.from(JSON.stringify(job)), {
    mandatory: true,
    persistent: true,
    contentType: "application/json",
    replyTo,
    correlationId: job.id,
    timestamp: Math.floor(Date.now() / 1000),
  });
  await ch.waitForConfirms();
  if (returned) throw new Error(`no queue ${jobsQueue}: is a mailgate worker started?`);
  console.log(JSON.stringify(await result));
} finally {
  await conn.close();
}
